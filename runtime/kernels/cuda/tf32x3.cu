// The split of float32 GEMM operands into TF32 halves for MathMode::kTF32x3 (see tf32x3.h for the method).
#include "runtime/kernels/cuda/tf32x3.h"

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "runtime/kernels/cuda/launch.cuh"

namespace ddp::kernels::cuda::detail {
namespace {

// To the nearest TF32 value (10 mantissa bits), ties away from zero: half a TF32 ulp added to the magnitude, the
// 13 low bits dropped. Infinities and NaNs stay as they are.
__device__ __forceinline__ float round_to_tf32(float v) {
  const unsigned bits = __float_as_uint(v);
  if ((bits & 0x7f800000u) == 0x7f800000u) return v;
  return __uint_as_float((bits + 0x1000u) & 0xffffe000u);
}

// `kVector` consecutive rows of one column per thread (4: 16-byte loads and stores), the operands one after the
// other over the grid.
template <int kVector>
__global__ void split_kernel(SplitOperand a, SplitOperand b, std::int64_t groups_a, std::int64_t groups_total) {
  begin_kernel();
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups_total;
       g += step) {
    const bool in_a = g < groups_a;
    const SplitOperand& op = in_a ? a : b;
    const std::int64_t i = in_a ? g : g - groups_a;
    const std::int64_t groups_per_column = op.rows / kVector;
    const std::int64_t c = i / groups_per_column;
    const std::int64_t r = (i - c * groups_per_column) * kVector;
    float hi[kVector], lo[kVector];
#pragma unroll
    for (int v = 0; v < kVector; ++v) {
      const float x = op.src[r + v + c * op.ld];
      hi[v] = round_to_tf32(x);
      // x − hi is exact in float32; a non-finite x has no low half.
      lo[v] = isfinite(x) ? round_to_tf32(x - hi[v]) : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      const float* piece = ((op.pieces >> p) & 1u) != 0 ? lo : hi;
      float* out = op.k_along_rows ? op.dst + p * op.rows + r + c * 3 * op.rows
                                   : op.dst + r + (p * op.cols + c) * op.rows;
      if constexpr (kVector == 4) {
        *reinterpret_cast<float4*>(out) = make_float4(piece[0], piece[1], piece[2], piece[3]);
      } else {
#pragma unroll
        for (int v = 0; v < kVector; ++v) out[v] = piece[v];
      }
    }
  }
}

bool vectorizable(const SplitOperand& op) {
  auto aligned = [](const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; };
  return op.rows % 4 == 0 && op.ld % 4 == 0 && aligned(op.src) && aligned(op.dst);
}

template <int kVector>
void launch_split(const SplitOperand& a, const SplitOperand& b, cudaStream_t stream) {
  const std::int64_t groups_a = a.rows * a.cols / kVector;
  const std::int64_t groups_total = groups_a + b.rows * b.cols / kVector;
  if (groups_total == 0) return;
  constexpr int kThreads = 256;
  // A grid-stride loop over at most a few waves of blocks: every SM busy, few blocks to schedule.
  const std::int64_t blocks = std::min<std::int64_t>((groups_total + kThreads - 1) / kThreads, 132 * 8);
  launch(split_kernel<kVector>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, a, b, groups_a,
         groups_total);
}

}  // namespace

void split_for_tf32x3(const SplitOperand& a, const SplitOperand& b, cudaStream_t stream) {
  if (vectorizable(a) && vectorizable(b)) {
    launch_split<4>(a, b, stream);
  } else {
    launch_split<1>(a, b, stream);
  }
}

}  // namespace ddp::kernels::cuda::detail
