// The scalar activation formulas shared by the fused linear epilogue and the standalone activation kernels,
// so both paths compute the same bits.
#pragma once

#include <cmath>

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

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// Both derivatives from the input x, as the standalone backward gets it.
inline float tanh_grad(float x) {
  const float t = std::tanh(x);
  return 1.0f - t * t;
}
inline float sigmoid_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f - s);
}

inline float activate(Activation act, float z) {
  switch (act) {
    case Activation::kRelu:
      return z > 0.0f ? z : 0.0f;
    case Activation::kGelu:
      return gelu(z);
    case Activation::kTanh:
      return std::tanh(z);
    case Activation::kSigmoid:
      return sigmoid(z);
    case Activation::kNone:
      break;
  }
  return z;
}

}  // namespace ddp::kernels::cpu::detail
