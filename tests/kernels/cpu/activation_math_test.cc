// The CPU's vectorised tanh, sigmoid and exp (runtime/kernels/cpu/activation_math.h) against double precision:
// ulp bounds over a dense sweep, the special values, and the standalone activation kernels' forward and backward.
#include "runtime/kernels/cpu/activation_math.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cpu {
namespace {

// |got - want| in units of the last place of `want` as a float.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double spacing = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

std::vector<float> sweep(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n));
  return xs;
}

TEST(ActivationMath, TanhIsWithin1Point3UlpEverywhere) {
  double worst = 0;
  float at = 0;
  std::vector<float> xs = sweep(-12.0f, 12.0f, 2000000);
  for (float x : sweep(-1e-3f, 1e-3f, 20000)) xs.push_back(x);
  for (float x : {1e-30f, -1e-30f, FLT_MIN, 0.625f, -0.625f, std::nextafter(0.625f, 0.0f), 9.0f}) xs.push_back(x);
  for (float x : xs) {
    const double u = ulps(detail::tanh(x), std::tanh(static_cast<double>(x)));
    if (u > worst) worst = u, at = x;
  }
  EXPECT_LE(worst, 1.3) << "at x = " << at;
}

TEST(ActivationMath, TanhKeepsSignsInfinitiesAndNaNs) {
  EXPECT_EQ(detail::tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(detail::tanh(-0.0f)));
  EXPECT_EQ(detail::tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(detail::tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(detail::tanh(100.0f), 1.0f);
  EXPECT_TRUE(std::isnan(detail::tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ActivationMath, SigmoidIsWithin2Point5UlpWhereItIsANormalFloat) {
  double worst = 0;
  float at = 0;
  for (float x : sweep(-80.0f, 100.0f, 2000000)) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    const double u = ulps(detail::sigmoid(x), want);
    if (u > worst) worst = u, at = x;
  }
  EXPECT_LE(worst, 2.5) << "at x = " << at;
  EXPECT_EQ(detail::sigmoid(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_GE(detail::sigmoid(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_LT(detail::sigmoid(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_TRUE(std::isnan(detail::sigmoid(std::numeric_limits<float>::quiet_NaN())));
}

TEST(ActivationMath, ExpIsWithin1Point1e7RelativeOverItsRange) {
  double worst = 0;
  for (float t : sweep(-87.0f, 88.0f, 2000000)) {
    const double want = std::exp(static_cast<double>(t));
    worst = std::max(worst, std::fabs(detail::exp_vectorisable(t) - want) / want);
  }
  EXPECT_LE(worst, 1.1e-7);
}

// The standalone kernels: forward, and backward (overwritten and accumulated) from the forward's output, against
// the derivative in double precision.
TEST(ActivationMath, TheKernelsComputeTheFunctionAndItsDerivative) {
  const std::vector<float> x = sweep(-6.0f, 6.0f, 1001);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> dy(x.size());
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = 0.5f + 0.001f * static_cast<float>(i);
  for (Activation act : {Activation::kTanh, Activation::kSigmoid}) {
    std::vector<float> y(x.size()), dx(x.size()), dx_acc(x.size(), 1.0f);
    activation_forward(act, x.data(), y.data(), n, nullptr);
    activation_backward(act, x.data(), y.data(), dy.data(), dx.data(), n, /*accumulate=*/false, nullptr);
    activation_backward(act, x.data(), y.data(), dy.data(), dx_acc.data(), n, /*accumulate=*/true, nullptr);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i];
      const double f = act == Activation::kTanh ? std::tanh(xd) : 1.0 / (1.0 + std::exp(-xd));
      const double grad = dy[i] * (act == Activation::kTanh ? 1.0 - f * f : f * (1.0 - f));
      EXPECT_NEAR(y[i], f, 3e-7) << "x = " << x[i];
      EXPECT_NEAR(dx[i], grad, 1e-6) << "x = " << x[i];
      EXPECT_NEAR(dx_acc[i], 1.0 + grad, 2e-6) << "x = " << x[i];
    }
  }
}


// The activation passes are built once per instruction set (target_clones in elementwise.cc) and the loader picks
// one by the CPU: each must compute the same bits, or a run's outputs would depend on the machine. The same
// loops, compiled here for each set with the kernels' flags, against the baseline's.
#define DDP_ACTIVATION_LOOP(name, isa)                                                          \
  __attribute__((target(isa))) void name(const float* x, float* y, std::int64_t n) {          \
    for (std::int64_t i = 0; i < n; ++i) y[3 * i] = detail::tanh(x[i]);                        \
    for (std::int64_t i = 0; i < n; ++i) y[3 * i + 1] = detail::sigmoid(x[i]);                 \
    for (std::int64_t i = 0; i < n; ++i) y[3 * i + 2] = detail::gelu(x[i]);                    \
  }
DDP_ACTIVATION_LOOP(activations_baseline, "arch=x86-64")
DDP_ACTIVATION_LOOP(activations_avx2, "avx2")
DDP_ACTIVATION_LOOP(activations_avx512, "avx512f")

TEST(ActivationMath, EveryInstructionSetComputesTheSameBits) {
  const std::vector<float> x = sweep(-20.0f, 20.0f, 400003);
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> want(3 * x.size()), got(3 * x.size());
  activations_baseline(x.data(), want.data(), n);
  int compared = 0;
  struct Clone {
    const char* isa;
    bool supported;
    void (*loop)(const float*, float*, std::int64_t);
  };
  for (const Clone& clone : {Clone{"avx2", __builtin_cpu_supports("avx2") != 0, &activations_avx2},
                             Clone{"avx512f", __builtin_cpu_supports("avx512f") != 0, &activations_avx512}}) {
    if (!clone.supported) continue;
    const char* isa = clone.isa;
    const auto loop = clone.loop;
    loop(x.data(), got.data(), n);
    std::size_t differ = 0, first = got.size();
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    }
    EXPECT_EQ(differ, 0u) << isa << ": " << differ << " of " << got.size()
                          << " values differ from the baseline's, the first "
                          << (first % 3 == 0   ? "tanh"
                              : first % 3 == 1 ? "sigmoid"
                                               : "gelu")
                          << "(" << x[first / 3] << ") = " << got[first] << " against " << want[first];
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512F: only the baseline runs here";
}

}  // namespace
}  // namespace ddp::kernels::cpu
