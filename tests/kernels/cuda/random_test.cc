// random.cu: the device evaluates runtime/kernels/counter_rng.h exactly as the host does.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cuda/gemm_options.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"
#include "tests/kernels/cuda/kernel_test_support.h"

namespace ddp::kernels::testing {
namespace {

TEST_F(CudaKernels, RandomMatchesHostCounterRngBitForBit) {
  const std::int64_t n = 300007;
  const std::uint64_t seed = 0x0123456789abcdefULL, offset = 123456789ULL;
  DeviceBuffer u(n * 4), g(n * 4), part(10 * 4);
  u.poison();
  g.poison();
  gpu::uniform(u.get<float>(), n, -0.25f, 0.75f, seed, offset, stream_);
  gpu::normal(g.get<float>(), n, 0.5f, 2.0f, seed, offset, stream_);
  sync();
  const auto uh = download<float>(u, n);
  const auto gh = download<float>(g, n);
  std::int64_t normal_mismatches = 0;
  double normal_max_diff = 0.0;
  double sum = 0.0, sum2 = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float want_u = counter_rng::uniform_at(seed, offset + i, -0.25f, 0.75f);
    ASSERT_EQ(float_bits(uh[i]), float_bits(want_u)) << "uniform element " << i;
    ASSERT_GE(uh[i], -0.25f);
    ASSERT_LE(uh[i], 0.75f);
    const float want_g = counter_rng::normal_at(seed, offset + i, 0.5f, 2.0f);
    if (float_bits(gh[i]) != float_bits(want_g)) {
      ++normal_mismatches;
      normal_max_diff = std::max(normal_max_diff, std::abs(static_cast<double>(gh[i]) - want_g));
    }
    sum += gh[i];
    sum2 += static_cast<double>(gh[i]) * gh[i];
  }
  EXPECT_EQ(normal_mismatches, 0) << "normal differs from the host in " << normal_mismatches
                                  << " elements, max |diff| " << normal_max_diff;
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(var, 4.0, 0.05);
  // Independent of the launch: a sub-range at a later offset gives the same values.
  gpu::uniform(part.get<float>(), 10, -0.25f, 0.75f, seed, offset + 1000, stream_);
  sync();
  const auto ph = download<float>(part, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(float_bits(ph[i]), float_bits(uh[1000 + i]));
}

}  // namespace
}  // namespace ddp::kernels::testing
