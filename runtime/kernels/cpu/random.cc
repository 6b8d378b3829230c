// CPU random fills through runtime/kernels/counter_rng.h, the generator runtime/kernels/cuda shares: element i depends only on
// (seed, offset + i), so the same call gives the same bits on both devices.
#include <cstdint>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cpu {

void uniform(float* data, std::int64_t n, float low, float high, std::uint64_t seed, std::uint64_t offset,
             StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < n; ++i) {
    data[i] = counter_rng::uniform_at(seed, offset + static_cast<std::uint64_t>(i), low, high);
  }
}

void normal(float* data, std::int64_t n, float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
            StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < n; ++i) {
    data[i] = counter_rng::normal_at(seed, offset + static_cast<std::uint64_t>(i), mean, stddev);
  }
}

}  // namespace ddp::kernels::cpu
