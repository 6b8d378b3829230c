// Device-side building blocks shared by the .cu files of runtime/kernels/cuda: launch shapes, bf16/float conversion,
// activation math, and fixed-order (hence deterministic) warp and block reductions.
//
// Determinism matters beyond tidiness: DESIGN.md promises bitwise-identical losses for the same seed, so no
// reduction here depends on scheduling (no float atomics; shuffles and shared memory in a fixed order; launch
// shapes that depend only on the problem size, never on the GPU's SM count).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "runtime/kernels/cuda/launch.cuh"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cuda::detail {

inline constexpr int kThreads = 256;
// Grid-stride loops cover the rest; this cap keeps launch shapes independent of the device.
inline constexpr std::int64_t kMaxBlocks = 4096;

inline unsigned int blocks_for(std::int64_t work_items, int threads = kThreads) {
  std::int64_t blocks = (work_items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned int>(blocks);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// ---- elementwise loops over n floats, four at a time where every pointer is 16-byte aligned ----
// A grid-stride loop: when `vectorized`, `quad(v)` for every whole group of four elements (4v .. 4v+3, float4
// index v), then `one(i)` for each element left over; otherwise `one(i)` for every element. Launch with
// blocks_by_four(n, vectorized) blocks of kThreads.
template <typename Quad, typename One>
__device__ __forceinline__ void for_each_by_four(std::int64_t n, bool vectorized, Quad&& quad, One&& one) {
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t scalar_from = 0;
  if (vectorized) {
    const std::int64_t n4 = n / 4;
    for (std::int64_t v = start; v < n4; v += stride) quad(v);
    scalar_from = n4 * 4;
  }
  for (std::int64_t i = scalar_from + start; i < n; i += stride) one(i);
}

inline unsigned int blocks_by_four(std::int64_t n, bool vectorized) { return blocks_for(vectorized ? (n + 3) / 4 : n); }

// `f` applied to each lane of a float4 (of two, lane by lane).
template <typename F>
__device__ __forceinline__ float4 map4(const float4& a, F&& f) {
  return make_float4(f(a.x), f(a.y), f(a.z), f(a.w));
}
template <typename F>
__device__ __forceinline__ float4 map4(const float4& a, const float4& b, F&& f) {
  return make_float4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
}

// ---- scalar types ----
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- eight consecutive elements as one or two 16-byte accesses (the pointer must be 16-byte aligned) ----
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

// ---- activations (exact GELU, as torch.nn.GELU()) ----
__device__ __forceinline__ float relu(float z) {
  // NaN propagates, as in torch.relu, so a non-finite check downstream still sees it.
  return z > 0.0f ? z : (z != z ? z : 0.0f);
}
__device__ __forceinline__ float gelu(float z) { return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f)); }
// d/dz [z·Φ(z)] = Φ(z) + z·φ(z)
__device__ __forceinline__ float gelu_grad(float z) {
  const float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * z * z);
  return cdf + z * pdf;
}
__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
// x·sigmoid(x) (torch.nn.SiLU) and its derivative from the input, s·(1 + x·(1 − s)).
__device__ __forceinline__ float silu(float z) { return z * sigmoid(z); }
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}
__device__ __forceinline__ float apply_activation(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return relu(z);
    case Activation::kGelu:
      return gelu(z);
    case Activation::kTanh:
      return tanhf(z);
    case Activation::kSigmoid:
      return sigmoid(z);
    case Activation::kSilu:
      return silu(z);
    default:
      return z;
  }
}
// For kRelu `saved` is the activation's output or input (the same sign test works for both); for kGelu it is the
// input, and for kSilu (standalone only) too; for kTanh and kSigmoid (standalone only) it is the output, so the function is not computed again. As
// torch's threshold_backward: the ReLU's gradient is 0 where the input is ≤ 0.
__device__ __forceinline__ float activation_grad(Activation act, float saved) {
  switch (act) {
    case Activation::kRelu:
      return saved > 0.0f ? 1.0f : 0.0f;
    case Activation::kGelu:
      return gelu_grad(saved);
    case Activation::kTanh:
      return 1.0f - saved * saved;
    case Activation::kSigmoid:
      return saved * (1.0f - saved);
    case Activation::kSilu:
      return silu_grad(saved);
    default:
      return 1.0f;
  }
}

// ---- reductions: butterfly shuffles and a fixed shared-memory order ----
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a 1-D block whose size is a multiple of 32 (≤ 1024). Result valid in thread 0.
// `shared` must hold 32 values. Contains __syncthreads: call from every thread of the block.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  T total = T(0);
  if (warp == 0) {
    total = lane < warps ? shared[lane] : T(0);
    total = warp_sum(total);
  }
  __syncthreads();  // `shared` may be reused right after
  return total;
}

// Σ partials[0..count) in index order by the calling block (1-D, a multiple of 32 threads); the result is valid in
// thread 0. The partials are read past L1 (__ldcg): other blocks of the same launch wrote them.
template <typename Acc>
__device__ __forceinline__ Acc sum_in_order(const Acc* partials, int count, Acc* shared) {
  Acc v = Acc(0);
  for (int i = threadIdx.x; i < count; i += blockDim.x) v += __ldcg(&partials[i]);
  return block_sum(v, shared);
}

// The "last block finishes" pattern, which saves the second launch of a two-pass reduction: each of the
// `arrivals` blocks that share `counter` writes its partial results, then calls this; it returns true in all
// threads of the one block that arrived last, which may then read every block's partials. The counter (from
// reduction_counters, zero before the launch) is zero again when the kernel ends, ready for the next launch or
// graph replay. Contains __syncthreads: call from every thread of the block, after its partials are written.
__device__ __forceinline__ bool arrived_last(unsigned int* counter, unsigned int arrivals) {
  __shared__ bool last;
  __threadfence();  // this block's partials are visible device-wide before the count says so
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(counter, 1u) == arrivals - 1;
    if (last) *counter = 0;  // every block has counted
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// A whole reduction's end in one launch: each block passes its total (valid in thread 0); the last block to
// finish writes out[0] = (Σ partials in index order) · scale. `partials` holds one value per block.
template <typename Acc, typename Out>
__device__ __forceinline__ void finish_sum(Acc block_total, Acc* partials, unsigned int* counter, Out* out,
                                           double scale) {
  __shared__ Acc shared[32];
  if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
  if (!arrived_last(counter, gridDim.x * gridDim.y)) return;
  const Acc total = sum_in_order(partials, static_cast<int>(gridDim.x), shared);
  if (threadIdx.x == 0) out[0] = static_cast<Out>(static_cast<double>(total) * scale);
}

}  // namespace ddp::kernels::cuda::detail
