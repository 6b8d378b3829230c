// Matmul precision for float32 inputs on the GPU, a user's choice (ddp::Linear, TrainerOptions): here in core so
// that the public header names it without reaching the kernel layer, which takes the same type.
#pragma once

#include <cstdint>

namespace ddp {

// Exact FP32, or TF32 tensor cores. bf16 inputs always accumulate in FP32. Ignored on the CPU.
enum class MathMode : std::uint8_t { kFloat32, kTF32 };

}  // namespace ddp
