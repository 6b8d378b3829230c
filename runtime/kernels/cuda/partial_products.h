// A GEMM's result left as partial products over slices of K (GemmOptions::parts), for a kernel that reads the
// result anyway to add in place of cuBLASLt's own split-K reduction kernel: the narrow head's forward (the hidden
// layer before it) and the activation-gradient pass of a backward (a wide layer's input gradient).
#pragma once

#include <cstdint>

namespace ddp::kernels::cuda::detail {

// The most slices one result is split into.
inline constexpr int kMaxPartialProducts = 8;

// Float32 parts of a row-major [rows, cols] result: part p of element (r, c) is data[p * stride + r * cols + c],
// and the result is the sum of the `count` parts taken in part order (so it is the same bits on every run).
struct PartialProducts {
  const float* data;
  int count;
  std::int64_t stride;
};

}  // namespace ddp::kernels::cuda::detail
