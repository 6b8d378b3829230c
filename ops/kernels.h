// The raw kernel interface every op is built on: one function per computation, over device pointers, taking
// the device's stream explicitly. Each function has two implementations with the same contract:
// ops/cpu/*.cc (OpenBLAS + loops; `stream` is ignored, the work is done on return) and ops/cuda/*.cu
// (cuBLAS/cuBLASLt + kernels, enqueued on `stream`, no host synchronisation, no allocation in steady state).
// The one list of functions is ops/kernel_functions.inc, declared here twice: in ddp::kernels::cpu and in
// ddp::kernels::cuda, so both implementations link into one binary and a test can compare them.
// The tensor-level ops (ops/*.h) dispatch here on the tensor's device and record their backward on the tape.
//
// Layout conventions: row-major; a Linear weight is [out, in] (PyTorch's layout), so y = x · Wᵀ + b.
// Every `accumulate` flag means "add into the output" (gradient accumulation) instead of overwriting it.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace ddp::kernels {

using StreamHandle = CUstream_st*;  // nullptr on the CPU

enum class ScalarType : std::uint8_t { kFloat32, kBFloat16, kInt32, kInt64 };

// GELU is the exact (erf) form, as torch.nn.GELU() by default.
enum class Activation : std::uint8_t { kNone, kRelu, kGelu };

// Matmul precision for float32 inputs on the GPU: exact FP32, or TF32 tensor cores. bf16 inputs always
// accumulate in FP32. Ignored on the CPU.
enum class MathMode : std::uint8_t { kFloat32, kTF32 };

// Element types of one Linear call. `input` is x's and w's (and dz's and dx's in the backward). `output` is y's,
// the bias's and pre_activation's (so dy's and the saved activation's); `grad` is dw's and dbias's. All three
// are `input` unless mixed precision asks otherwise: with bfloat16 input, `output` may be float32 (logits for
// a float32 loss straight from the GEMM) and `grad` may be float32 (the FP32 master weights' gradient slots,
// written by the GEMM with no bfloat16 weight gradient in between). Implicit from one type, so the uniform
// case reads `linear_forward(ScalarType::kFloat32, ...)`.
struct LinearTypes {
  ScalarType input, output, grad;
  LinearTypes(ScalarType all) : input(all), output(all), grad(all) {}  // NOLINT(runtime/explicit): see above
  LinearTypes(ScalarType in, ScalarType out, ScalarType g) : input(in), output(out), grad(g) {}
};

struct LinearShape {
  std::int64_t batch;  // rows of x
  std::int64_t in;     // features in
  std::int64_t out;    // features out
};

// Hyperparameters are double, as PyTorch's (Python floats): derived constants such as 1 − β₂ are formed in
// double before they are rounded to float, so the update matches torch.optim to float rounding.
struct SgdParams {
  double lr;
  double momentum;      // 0 disables the buffer
  double dampening;     // PyTorch's dampening (0 by default)
  double weight_decay;  // L2, added to the gradient as in torch.optim.SGD
  bool nesterov;
  bool first_step;      // PyTorch initialises the momentum buffer to the gradient on the first step
};
struct AdamWParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;  // decoupled: param *= 1 − lr·wd before the Adam update
  std::int64_t step;    // 1-based step count after this update, for bias correction
};
}  // namespace ddp::kernels

namespace ddp::kernels::cpu {
#include "ops/kernel_functions.inc"
}  // namespace ddp::kernels::cpu

namespace ddp::kernels::cuda {
#include "ops/kernel_functions.inc"
}  // namespace ddp::kernels::cuda
