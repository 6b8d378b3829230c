// The scalar activation formulas shared by the fused linear epilogue and the standalone activation kernels,
// so both paths compute the same bits.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cpu::detail {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// Exact GELU, as torch.nn.GELU(): x·Φ(x).
inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); }
// d/dx x·Φ(x) = Φ(x) + x·φ(x).
inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

// e^t for t in [-87, 88], in a form the compiler vectorises (no libm call, no branch): t = k·ln 2 + r with
// |r| <= ln 2 / 2 (ln 2 in two parts, so that r is exact), e^r by its Taylor polynomial to r^7 (relative error
// below 1.1e-7), and 2^k put into the exponent bits. The rounding of t·log2(e) to k adds and subtracts 1.5·2^23,
// which needs the default rounding mode and no -ffast-math.
inline float exp_vectorisable(float t) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693359375f;  // ln 2 = kLn2High + kLn2Low; kLn2High has 9 significant bits
  constexpr float kLn2Low = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;     // 1.5·2^23
  const float shifted = t * kLog2e + kRound;  // k in its low mantissa bits
  const float k = shifted - kRound;
  const float r = (t - k * kLn2High) - k * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // k + 127 as the exponent field, read from the bits (a NaN t stays NaN through p, with no undefined cast).
  const std::uint32_t exponent = std::bit_cast<std::uint32_t>(shifted) - std::bit_cast<std::uint32_t>(kRound) + 127u;
  const float two_to_k = std::bit_cast<float>(exponent << 23);
  return p * two_to_k;
}

// tanh within 1.3 ulp of the exact value (tests/kernels/cpu:activation_math_test), vectorised:
// below |x| = 0.625 x·P(x²), a least-squares fit of tanh(x)/x of degree 5 in x²; above, 1 - 2/(e^{2|x|} + 1),
// where 1 - tanh no longer cancels; from |x| = 9.1 on, tanh rounds to ±1 (|x| is clamped at 10).
inline float tanh(float x) {
  const float a = std::min(std::fabs(x), 10.0f);
  const float u = a * a;
  float p = -0.00566478f;
  p = p * u + 0.02059568f;
  p = p * u - 0.05372268f;
  p = p * u + 0.1333115f;
  p = p * u - 0.33333263f;
  p = p * u + 1.0f;
  const float near_zero = a * p;
  const float far = 1.0f - 2.0f / (exp_vectorisable(a + a) + 1.0f);
  return std::copysign(a < 0.625f ? near_zero : far, x);
}

// 1 / (1 + e^-x), within 2.5 ulp where the value is a normal float (the same test); x is clamped where e^-x
// would overflow.
inline float sigmoid(float x) { return 1.0f / (1.0f + exp_vectorisable(-std::clamp(x, -87.0f, 87.0f))); }

// x·sigmoid(x), as torch.nn.SiLU; its derivative from the input, s·(1 + x·(1 − s)) with s = sigmoid(x).
inline float silu(float x) { return x * sigmoid(x); }
inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// Both derivatives from the output y, which the forward kept: nothing is computed again.
inline float tanh_grad_from_output(float y) { return 1.0f - y * y; }
inline float sigmoid_grad_from_output(float y) { return y * (1.0f - y); }

inline float activate(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0.0f ? z : 0.0f;
    case Activation::kGelu:
      return gelu(z);
    case Activation::kTanh:
      return tanh(z);
    case Activation::kSigmoid:
      return sigmoid(z);
    case Activation::kSilu:
      return silu(z);
    case Activation::kNone:
      break;
  }
  return z;
}

}  // namespace ddp::kernels::cpu::detail
