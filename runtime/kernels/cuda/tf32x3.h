// FP32 products on TF32 tensor cores (MathMode::kTF32x3): the operands of a float32 GEMM split into a high and a
// low TF32 half each, and the GEMM run once over three times the depth.
//
// Why: an FP32 GEMM without tensor cores runs on the SIMT units, several times slower than TF32 on Hopper, and at
// an MLP's shapes it is most of a training step. A float32 value is x = hi + lo + r with hi = tf32(x),
// lo = tf32(x − hi) and |r| ≤ 2⁻²³·|x|, so a·b = a_hi·b_hi + a_hi·b_lo + a_lo·b_hi up to terms of the order of
// one FP32 rounding (the 3xTF32 method). The three products are one GEMM: A' = [a_hi | a_hi | a_lo] and
// B' = [b_hi ; b_lo ; b_hi] laid side by side along K, so cuBLASLt sums them with the same accumulation it gives
// any product. The halves are rounded here, to nearest, so the tensor cores receive values that are exact in TF32
// and the result does not depend on how they would round a float32 themselves.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ddp::kernels::cuda::detail {

// Which half of a value each of the three pieces is: bit p of the mask set means piece p is the low half.
inline constexpr unsigned kPiecesOfA = 0b100;  // a_hi, a_hi, a_lo
inline constexpr unsigned kPiecesOfB = 0b010;  // b_hi, b_lo, b_hi

// One column-major operand [rows, cols] (leading dimension `ld`) whose K runs along its rows (K contiguous,
// `k_along_rows`) or along its columns, and where its three pieces go: `dst`, column-major, compact, K three
// times as long ([3·rows, cols] or [rows, 3·cols]), pieces one after another along K.
struct SplitOperand {
  const float* src;
  std::int64_t rows, cols, ld;
  bool k_along_rows;
  unsigned pieces;
  float* dst;
};

// Both operands of one GEMM in one launch.
void split_for_tf32x3(const SplitOperand& a, const SplitOperand& b, cudaStream_t stream);

}  // namespace ddp::kernels::cuda::detail
