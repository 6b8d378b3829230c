// The gradient check every op test of tests/ops uses: analytic gradients (from backward) against central finite
// differences of the float32 op, on the CPU, with the inputs and targets those tests share.
//
// Tolerance: |analytic − numeric| <= 2e-3 + 2e-2·|numeric| with step h (1e-2 by default) on inputs of size ~1.
// Central differences have O(h²) truncation error (~1e-4 here) and float32 rounding error of about 1e-7·|L|/h
// (~1e-5); the bound leaves room for both and still catches any wrong term (those are O(1)).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/tensor/tensor.h"

namespace ddp::test {

inline const Stream& S() { return cpu_stream(); }

inline Tensor leaf(const Shape& shape, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::uniform(shape, lo, hi, seed, 0, Device::cpu(), S());
  t.set_requires_grad(true);
  return t;
}

// Pushes values away from 0 by at least `margin` (keeps ReLU's kink out of the finite differences).
inline void away_from_zero(Tensor& t, float margin) {
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::abs(p[i]) < margin) p[i] = p[i] < 0 ? -margin - std::abs(p[i]) : margin + p[i];
}

inline float loss_value(const std::function<Tensor()>& f) {
  autograd::NoGradGuard guard;
  return f().to_vector<float>(S())[0];
}

// Runs backward once, then checks every element of every input by central differences of step `h`.
inline void gradcheck(const std::function<Tensor()>& f, std::vector<Tensor> inputs, const std::string& what,
                      double h = 1e-2) {
  for (Tensor& t : inputs) autograd::zero_grad({t});
  autograd::backward(f(), S());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    Tensor& t = inputs[k];
    ASSERT_TRUE(t.grad().defined()) << what << ": input " << k << " got no gradient";
    const std::vector<float> analytic = t.grad().to_vector<float>(S());
    float* p = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float saved = p[i];
      p[i] = static_cast<float>(saved + h);
      const double up = loss_value(f);
      p[i] = static_cast<float>(saved - h);
      const double down = loss_value(f);
      p[i] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[static_cast<std::size_t>(i)], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << what << ": input " << k << " element " << i;
    }
  }
}

// A fixed target so mse_loss turns any output into a scalar with a non-trivial gradient.
inline Tensor target_like(const Shape& shape) {
  return Tensor::uniform(shape, -1.0f, 1.0f, 999, 0, Device::cpu(), S());
}

}  // namespace ddp::test
