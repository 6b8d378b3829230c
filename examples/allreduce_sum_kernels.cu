#include "examples/allreduce_sum_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "runtime/core/check.h"

namespace ddp::examples {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

__device__ double block_sum(double value) {
  __shared__ double shared[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = threadIdx.x < kThreads / 32 ? shared[threadIdx.x] : 0.0;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  return value;
}

__global__ void double_and_partial_sum(float* data, std::size_t n, double* partials) {
  double local = 0.0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float doubled = 2.0f * data[i];
    data[i] = doubled;
    local += static_cast<double>(doubled);
  }
  const double total = block_sum(local);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials(const double* partials, int count, double* out) {
  double local = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) local += partials[i];
  const double total = block_sum(local);
  if (threadIdx.x == 0) *out = total;
}

int blocks_for(std::size_t n) {
  return static_cast<int>(std::min<std::size_t>(kMaxBlocks, (n + kThreads - 1) / kThreads));
}

}  // namespace

std::size_t double_and_sum_scratch(std::size_t n) { return static_cast<std::size_t>(std::max(1, blocks_for(n))); }

void double_and_sum_cuda(float* data, std::size_t n, double* sum, double* scratch, std::size_t scratch_len,
                         CUstream_st* stream) {
  const int blocks = std::max(1, blocks_for(n));
  DDP_CHECK(scratch_len >= static_cast<std::size_t>(blocks), "scratch too small for the partial sums");
  double_and_partial_sum<<<blocks, kThreads, 0, stream>>>(data, n, scratch);
  DDP_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, kThreads, 0, stream>>>(scratch, blocks, sum);
  DDP_CUDA_CHECK_LAUNCH();
}

}  // namespace ddp::examples
