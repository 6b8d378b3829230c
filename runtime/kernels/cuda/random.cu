// kernels::uniform and kernels::normal on the GPU: element i is runtime/kernels/counter_rng.h evaluated at (seed, offset + i),
// the same function runtime/kernels/cpu/random.cc evaluates, so a tensor initialised on either device has the same bits.
// One thread per element; no generator state lives on the device, so any launch shape gives the same result.
#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

__global__ void uniform_kernel(float* __restrict__ data, std::int64_t n, float low, float high, std::uint64_t seed,
                               std::uint64_t offset) {
  detail::begin_kernel();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = counter_rng::uniform_at(seed, offset + static_cast<std::uint64_t>(i), low, high);
}

__global__ void normal_kernel(float* __restrict__ data, std::int64_t n, float mean, float stddev, std::uint64_t seed,
                              std::uint64_t offset) {
  detail::begin_kernel();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = counter_rng::normal_at(seed, offset + static_cast<std::uint64_t>(i), mean, stddev);
}

}  // namespace

void uniform(float* data, std::int64_t n, float low, float high, std::uint64_t seed, std::uint64_t offset,
             StreamHandle stream) {
  if (n <= 0) return;
  detail::launch(uniform_kernel, detail::blocks_for(n), detail::kThreads, 0, stream, data, n, low, high, seed, offset);
}

void normal(float* data, std::int64_t n, float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
            StreamHandle stream) {
  if (n <= 0) return;
  detail::launch(normal_kernel, detail::blocks_for(n), detail::kThreads, 0, stream, data, n, mean, stddev, seed,
                 offset);
}

}  // namespace ddp::kernels::cuda
