// Every tensor-level op on the CPU: forward against a double-precision reference, and analytic gradients
// (from backward) against central finite differences of the float32 op (tests/ops/gradcheck.h, whose
// tolerance is explained there). Inputs of ReLU are kept at least 0.05 from the kink so the difference never
// straddles it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/ops/ops.h"
#include "tests/ops/gradcheck.h"

namespace ddp {
namespace {

using ddp::Activation;
using namespace ddp::test;  // NOLINT(build/namespaces): the gradient-check helpers

// Shapes of every kind of product: a matrix's, one output (a matrix times a vector), a batch of one (a vector
// times a matrix), both, and one input (an outer product in the backward).
struct LinearCase {
  std::int64_t B, I, O;
};
constexpr LinearCase kLinearCases[] = {{3, 5, 4}, {3, 5, 1}, {1, 5, 4}, {1, 5, 1}, {3, 1, 4}};
// More outputs than the CPU kernel's block of bias-gradient sums, with some left over.
constexpr LinearCase kWideCase = {3, 2, 37};

TEST(Linear, ForwardMatchesDoubleReference) {
  for (const auto [B, I, O] : kLinearCases)
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    Tensor x = leaf({B, I}, 1), w = leaf({O, I}, 2), b = leaf({O}, 3);
    Tensor y;
    {
      autograd::NoGradGuard g;
      y = ops::linear(x, w, b, act, S());
    }
    const float *xp = x.data<float>(), *wp = w.data<float>(), *bp = b.data<float>();
    std::vector<float> yv = y.to_vector<float>(S());
    for (std::int64_t r = 0; r < B; ++r) {
      for (std::int64_t o = 0; o < O; ++o) {
        double z = bp[o];
        for (std::int64_t i = 0; i < I; ++i) z += static_cast<double>(xp[r * I + i]) * wp[o * I + i];
        double ref = z;
        if (act == Activation::kRelu) ref = z > 0 ? z : 0;
        if (act == Activation::kGelu) ref = 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
        EXPECT_NEAR(yv[r * O + o], ref, 1e-5)
            << "act " << static_cast<int>(act) << " shape " << B << "x" << I << "x" << O;
      }
    }
  }
}

TEST(Linear, GradientsByFiniteDifferences) {
  for (const auto [B, I, O] : kLinearCases)
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    for (bool with_bias : {true, false}) {
      // ReLU's finite differences need every pre-activation at least 0.05 from the kink: the first seeds that
      // give such inputs.
      Tensor x, w, b;
      for (std::uint64_t seed = 10;; seed += 3) {
        x = leaf({B, I}, seed), w = leaf({O, I}, seed + 1), b = with_bias ? leaf({O}, seed + 2) : Tensor();
        if (act != Activation::kRelu) break;
        autograd::NoGradGuard g;
        float min_abs = 1e9f;
        for (float v : ops::linear(x, w, b, Activation::kNone, S()).to_vector<float>(S())) {
          min_abs = std::min(min_abs, std::abs(v));
        }
        if (min_abs >= 0.05f) break;
        ASSERT_LT(seed, 100u) << "no seed keeps the pre-activations away from the ReLU kink";
      }
      Tensor t = target_like({B, O});
      std::vector<Tensor> inputs{x, w};
      if (with_bias) inputs.push_back(b);
      gradcheck([&] { return ops::mse_loss(ops::linear(x, w, b, act, S()), t, S()); }, inputs,
                (with_bias ? "linear+bias " : "linear ") + std::to_string(B) + "x" + std::to_string(I) + "x" +
                    std::to_string(O));
    }
  }
}

TEST(Linear, WideOutputGradientsByFiniteDifferences) {
  const auto [B, I, O] = kWideCase;
  Tensor x = leaf({B, I}, 30), w = leaf({O, I}, 31), b = leaf({O}, 32);
  Tensor t = target_like({B, O});
  gradcheck([&] { return ops::mse_loss(ops::linear(x, w, b, Activation::kGelu, S()), t, S()); }, {x, w, b},
            "wide linear+bias");
}

TEST(Linear, SecondBackwardAccumulatesIntoEveryGradient) {
  for (const auto [B, I, O] : {LinearCase{3, 5, 4}, kWideCase}) {
    Tensor x = leaf({B, I}, 20), w = leaf({O, I}, 21), b = leaf({O}, 22);
    Tensor t = target_like({B, O});
    auto f = [&] { return ops::mse_loss(ops::linear(x, w, b, Activation::kGelu, S()), t, S()); };
    autograd::backward(f(), S());
    std::vector<std::vector<float>> g1;
    for (Tensor* p : {&x, &w, &b}) g1.push_back(p->grad().to_vector<float>(S()));
    autograd::backward(f(), S());
    int k = 0;
    for (Tensor* p : {&x, &w, &b}) {
      std::vector<float> g2 = p->grad().to_vector<float>(S());
      for (std::size_t i = 0; i < g2.size(); ++i) EXPECT_NEAR(g2[i], 2 * g1[k][i], 1e-6) << "input " << k;
      ++k;
    }
  }
}

TEST(Linear, Bfloat16MatchesFloat32WithinBf16Precision) {
  Tensor x = leaf({4, 16}, 30), w = leaf({8, 16}, 31), b = leaf({8}, 32);
  Tensor yf, yh;
  {
    autograd::NoGradGuard g;
    yf = ops::linear(x, w, b, Activation::kGelu, S());
    yh = ops::linear(x.to_dtype(DType::kBFloat16, S()), w.to_dtype(DType::kBFloat16, S()),
                     b.to_dtype(DType::kBFloat16, S()), Activation::kGelu, S());
  }
  const std::vector<float> a = yf.to_vector<float>(S());
  const std::vector<float> c = yh.to_dtype(DType::kFloat32, S()).to_vector<float>(S());
  // Inputs rounded to 8 bits of mantissa (rel. 2^-9 each), sums of 16 products of |.| <= 1, output rounded.
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(c[i], a[i], 0.03 + 0.01 * std::abs(a[i]));
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// linear_mixed (bf16 GEMMs, float32 master weights): the forward is the float32 linear of the bf16-rounded
// operands; the float32 masters receive float32 gradients, those of the same computation up to dz being rounded
// to bf16 (what the GEMMs read), and the bf16 copies receive none.
TEST(LinearMixed, Float32MastersGetTheGradientsOfTheRoundedComputation) {
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu}) {
    const std::int64_t B = 5, I = 12, O = 7;
    Tensor x = Tensor::uniform({B, I}, -1.0f, 1.0f, 60, 0, Device::cpu(), S());
    Tensor w = leaf({O, I}, 61), b = leaf({O}, 62);  // the float32 masters
    const Tensor x_bf = x.to_dtype(DType::kBFloat16, S());
    const Tensor w_bf = w.to_dtype(DType::kBFloat16, S()), b_bf = b.to_dtype(DType::kBFloat16, S());
    Tensor t = target_like({B, O});

    autograd::zero_grad({w, b});
    Tensor y = ops::linear_mixed(x_bf, w, w_bf, b, b_bf, act, DType::kFloat32, S());
    ASSERT_EQ(y.dtype(), DType::kFloat32);
    autograd::backward(ops::mse_loss(y, t, S()), S());

    // Reference: float32 linear over the rounded values (bias: the float32 master, as for a float32 output).
    Tensor xr = x_bf.to_dtype(DType::kFloat32, S());
    Tensor wr = w_bf.to_dtype(DType::kFloat32, S());
    Tensor br = b.clone(S());
    wr.set_requires_grad(true);
    br.set_requires_grad(true);
    Tensor yr = ops::linear(xr, wr, br, act, S());
    autograd::backward(ops::mse_loss(yr, t, S()), S());

    const char* name = act == Activation::kNone ? "none" : act == Activation::kRelu ? "relu" : "gelu";
    EXPECT_LT(rel_l2(y.to_vector<float>(S()), yr.to_vector<float>(S())), 1e-6) << name;
    ASSERT_TRUE(w.grad().defined() && b.grad().defined()) << name;
    EXPECT_EQ(w.grad().dtype(), DType::kFloat32);
    EXPECT_FALSE(w_bf.grad().defined()) << "the bf16 copy must not receive a gradient";
    EXPECT_LT(rel_l2(w.grad().to_vector<float>(S()), wr.grad().to_vector<float>(S())), 1e-2) << name;
    EXPECT_LT(rel_l2(b.grad().to_vector<float>(S()), br.grad().to_vector<float>(S())), 1e-2) << name;

    // A bfloat16 output adds the bf16 bias copy and rounds y once.
    autograd::NoGradGuard guard;
    Tensor yh = ops::linear_mixed(x_bf, w, w_bf, b, b_bf, act, DType::kBFloat16, S());
    ASSERT_EQ(yh.dtype(), DType::kBFloat16);
    Tensor yh_ref = ops::linear(x_bf, w_bf, b_bf, act, S());
    EXPECT_EQ(rel_l2(yh.to_dtype(DType::kFloat32, S()).to_vector<float>(S()),
                     yh_ref.to_dtype(DType::kFloat32, S()).to_vector<float>(S())),
              0.0)
        << name;
  }
}

TEST(LinearMixed, RefusesWrongTypes) {
  Tensor x = Tensor::zeros({2, 4}, DType::kBFloat16, Device::cpu(), S());
  Tensor w = Tensor::zeros({3, 4}, DType::kFloat32, Device::cpu(), S());
  Tensor w_bf = Tensor::zeros({3, 4}, DType::kBFloat16, Device::cpu(), S());
  // The master must be float32, the copy bfloat16, x bfloat16.
  EXPECT_THROW(ops::linear_mixed(x, w_bf, w_bf, Tensor(), Tensor(), Activation::kNone, DType::kFloat32, S()), Error);
  EXPECT_THROW(ops::linear_mixed(x.to_dtype(DType::kFloat32, S()), w, w_bf, Tensor(), Tensor(), Activation::kNone,
                                 DType::kFloat32, S()),
               Error);
  EXPECT_THROW(ops::linear_mixed(x, w, Tensor::zeros({4, 3}, DType::kBFloat16, Device::cpu(), S()), Tensor(),
                                 Tensor(), Activation::kNone, DType::kFloat32, S()),
               Error);
  // A master bias without its copy.
  EXPECT_THROW(ops::linear_mixed(x, w, w_bf, Tensor::zeros({3}, DType::kFloat32, Device::cpu(), S()), Tensor(),
                                 Activation::kNone, DType::kFloat32, S()),
               Error);
}

TEST(Linear, ShapeErrorsNameTheShapes) {
  Tensor x = Tensor::zeros({2, 783}, DType::kFloat32, Device::cpu(), S());
  Tensor w = Tensor::zeros({10, 784}, DType::kFloat32, Device::cpu(), S());
  try {
    ops::linear(x, w, Tensor(), Activation::kNone, S());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear: x has 783 features, weight expects 784"), std::string::npos)
        << e.what();
  }
  Tensor bad_bias = Tensor::zeros({9}, DType::kFloat32, Device::cpu(), S());
  EXPECT_THROW(ops::linear(Tensor::zeros({2, 784}, DType::kFloat32, Device::cpu(), S()), w, bad_bias,
                           Activation::kNone, S()),
               Error);
}

TEST(Activation, ReluAndGeluGradients) {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    Tensor x = leaf({3, 7}, 40, -2.0f, 2.0f);
    if (act == Activation::kRelu) away_from_zero(x, 0.05f);
    Tensor t = target_like({3, 7});
    gradcheck([&] { return ops::mse_loss(ops::activation(x, act, S()), t, S()); }, {x},
              act == Activation::kRelu ? "relu" : "gelu");
    // Forward against the formula in double.
    autograd::NoGradGuard g;
    std::vector<float> y = ops::activation(x, act, S()).to_vector<float>(S());
    const float* xp = x.data<float>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double v = xp[i];
      const double ref = act == Activation::kRelu ? (v > 0 ? v : 0) : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      EXPECT_NEAR(y[i], ref, 1e-6);
    }
  }
}

TEST(Activation, TanhAndSigmoidGradientsAndValuesAsTorch) {
  for (Activation act : {Activation::kTanh, Activation::kSigmoid}) {
    Tensor x = leaf({3, 7}, 41, -3.0f, 3.0f);
    Tensor t = target_like({3, 7});
    gradcheck([&] { return ops::mse_loss(ops::activation(x, act, S()), t, S()); }, {x},
              act == Activation::kTanh ? "tanh" : "sigmoid");
    autograd::NoGradGuard g;
    std::vector<float> y = ops::activation(x, act, S()).to_vector<float>(S());
    const float* xp = x.data<float>();
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double v = xp[i];
      const double ref = act == Activation::kTanh ? std::tanh(v) : 1.0 / (1.0 + std::exp(-v));
      EXPECT_NEAR(y[i], ref, 1e-6);
    }
  }
}

TEST(Linear, RefusesToFuseTanhOrSigmoid) {
  Tensor x = leaf({2, 3}, 42, -1.0f, 1.0f), w = leaf({4, 3}, 43, -1.0f, 1.0f);
  EXPECT_THROW(ops::linear(x, w, Tensor(), Activation::kTanh, S()), InvalidArgument);
}

TEST(Losses, CrossEntropyValueAndGradient) {
  Tensor logits = leaf({4, 5}, 50, -3.0f, 3.0f);
  Tensor y = Tensor::from_int32({0, 4, 2, 2}, {4}, Device::cpu(), S());
  // Value against log-sum-exp in double.
  double ref = 0;
  const float* l = logits.data<float>();
  const int label[4] = {0, 4, 2, 2};
  for (int r = 0; r < 4; ++r) {
    double s = 0;
    for (int c = 0; c < 5; ++c) s += std::exp(static_cast<double>(l[r * 5 + c]));
    ref += std::log(s) - l[r * 5 + label[r]];
  }
  EXPECT_NEAR(loss_value([&] { return ops::cross_entropy(logits, y, S()); }), ref / 4, 1e-6);
  gradcheck([&] { return ops::cross_entropy(logits, y, S()); }, {logits}, "cross_entropy");
  // Stable for huge logits: no overflow.
  Tensor big = Tensor::from_vector({1000.0f, 0.0f, -1000.0f, 0.0f}, {2, 2}, Device::cpu(), S());
  const float v = loss_value([&] { return ops::cross_entropy(big, Tensor::from_int32({1, 0}, {2}, Device::cpu(), S()), S()); });
  EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(v, 1000.0, 1e-3);  // both rows pick the logit 1000 below the max
}

// bfloat16 logits (forward_bf16's): the loss of the float32 cross-entropy over the same (rounded) values, and its
// gradient rounded to bfloat16.
TEST(Losses, CrossEntropyOnBfloat16Logits) {
  Tensor logits32 = leaf({6, 9}, 55, -3.0f, 3.0f);
  Tensor logits = logits32.to_dtype(DType::kBFloat16, S());
  logits.set_requires_grad(true);
  Tensor rounded = logits.to_dtype(DType::kFloat32, S());
  rounded.set_requires_grad(true);
  Tensor y = Tensor::from_int32({0, 8, 2, 2, 5, 1}, {6}, Device::cpu(), S());
  Tensor loss = ops::cross_entropy(logits, y, S());
  Tensor loss_ref = ops::cross_entropy(rounded, y, S());
  EXPECT_EQ(loss.dtype(), DType::kFloat32);
  EXPECT_FLOAT_EQ(loss.to_vector<float>(S())[0], loss_ref.to_vector<float>(S())[0]);
  autograd::backward(loss, S());
  autograd::backward(loss_ref, S());
  ASSERT_EQ(logits.grad().dtype(), DType::kBFloat16);
  const std::vector<float> g = logits.grad().to_dtype(DType::kFloat32, S()).to_vector<float>(S());
  const std::vector<float> want = rounded.grad().to_dtype(DType::kBFloat16, S()).to_dtype(DType::kFloat32, S())
                                      .to_vector<float>(S());
  EXPECT_EQ(g, want);
}

TEST(Losses, CrossEntropyRejectsBadLabels) {
  Tensor logits = leaf({2, 3}, 51);
  EXPECT_THROW(ops::cross_entropy(logits, Tensor::from_int32({0, 3}, {2}, Device::cpu(), S()), S()), Error);
  EXPECT_THROW(ops::cross_entropy(logits, Tensor::from_int32({0}, {1}, Device::cpu(), S()), S()), Error);
  autograd::clear_tape();
}

TEST(Losses, MseValueAndGradient) {
  Tensor p = leaf({3, 4}, 60);
  Tensor t = target_like({3, 4});
  double ref = 0;
  for (int i = 0; i < 12; ++i) {
    const double d = static_cast<double>(p.data<float>()[i]) - t.data<float>()[i];
    ref += d * d;
  }
  EXPECT_NEAR(loss_value([&] { return ops::mse_loss(p, t, S()); }), ref / 12, 1e-6);
  gradcheck([&] { return ops::mse_loss(p, t, S()); }, {p}, "mse");
  EXPECT_THROW(ops::mse_loss(p, target_like({4, 3}), S()), Error);
}

TEST(Metrics, ArgmaxAndAccuracy) {
  Tensor logits = Tensor::from_vector({0.1f, 0.9f, 0.0f,   //
                                       2.0f, 2.0f, 1.0f,   // tie: lowest index
                                       -1.0f, -3.0f, -0.5f},
                                      {3, 3}, Device::cpu(), S());
  EXPECT_EQ(ops::argmax(logits, S()).to_vector<std::int32_t>(S()), (std::vector<std::int32_t>{1, 0, 2}));
  Tensor y = Tensor::from_int32({1, 1, 2}, {3}, Device::cpu(), S());
  EXPECT_EQ(ops::count_correct(logits, y, S()).to_vector<std::int64_t>(S())[0], 2);
  EXPECT_NEAR(ops::accuracy(logits, y, S()), 2.0 / 3.0, 1e-12);
}

// add, scale and mul: forward against double arithmetic, gradients by finite differences, also when one tensor
// is both inputs (its gradient is then the sum of both terms: overwrite, then accumulate).
TEST(Elementwise, AddScaleMulValuesAndGradients) {
  Tensor a = leaf({4, 5}, 60), b = leaf({4, 5}, 61);
  Tensor t = target_like({4, 5});
  {
    autograd::NoGradGuard g;
    const std::vector<float> sum = ops::add(a, b, S()).to_vector<float>(S());
    const std::vector<float> scaled = ops::scale(a, -2.5, S()).to_vector<float>(S());
    const std::vector<float> product = ops::mul(a, b, S()).to_vector<float>(S());
    const float *ap = a.data<float>(), *bp = b.data<float>();
    for (std::size_t i = 0; i < sum.size(); ++i) {
      EXPECT_EQ(sum[i], ap[i] + bp[i]);
      EXPECT_EQ(scaled[i], -2.5f * ap[i]);
      EXPECT_EQ(product[i], ap[i] * bp[i]);
    }
  }
  gradcheck([&] { return ops::mse_loss(ops::add(a, b, S()), t, S()); }, {a, b}, "add");
  gradcheck([&] { return ops::mse_loss(ops::scale(a, -2.5, S()), t, S()); }, {a}, "scale");
  gradcheck([&] { return ops::mse_loss(ops::mul(a, b, S()), t, S()); }, {a, b}, "mul");
  gradcheck([&] { return ops::mse_loss(ops::mul(a, a, S()), t, S()); }, {a}, "mul(a, a)");
  gradcheck([&] { return ops::mse_loss(ops::add(a, ops::mul(a, b, S()), S()), t, S()); }, {a, b}, "a + a*b");
}

TEST(Elementwise, RefusesMismatchedInputs) {
  Tensor a = leaf({4, 5}, 62);
  try {
    ops::add(a, leaf({5, 4}, 63), S());
    FAIL() << "shapes [4, 5] and [5, 4] were added";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("add: the inputs must have one shape, got float32 [4, 5] on cpu and "
                                         "float32 [5, 4] on cpu"),
              std::string::npos)
        << e.what();
  }
  Tensor labels = Tensor::from_int32({1, 2}, {2}, Device::cpu(), S());
  EXPECT_THROW(ops::mul(labels, labels, S()), InvalidArgument);
  EXPECT_THROW(ops::scale(Tensor(), 2.0, S()), InvalidArgument);
}

// On the CPU to_device is a copy whose gradient is the identity (tests/gpu covers the copies across devices).
TEST(Elementwise, ToDeviceCopiesAndPassesTheGradient) {
  Tensor a = leaf({3, 4}, 64);
  Tensor t = target_like({3, 4});
  Tensor copy = ops::to_device(a, Device::cpu(), S());
  EXPECT_FALSE(copy.shares_storage_with(a));
  EXPECT_EQ(copy.to_vector<float>(S()), a.to_vector<float>(S()));
  gradcheck([&] { return ops::mse_loss(ops::scale(ops::to_device(a, Device::cpu(), S()), 3.0, S()), t, S()); }, {a},
            "to_device");
}

TEST(Elementwise, InPlaceScaleAndAdd) {
  Tensor a = Tensor::from_vector({1, -2, 3}, {3}, Device::cpu(), S());
  Tensor b = Tensor::from_vector({0.5f, 0.25f, -1}, {3}, Device::cpu(), S());
  a.scale_(2.0, S());
  EXPECT_EQ(a.to_vector<float>(S()), (std::vector<float>{2, -4, 6}));
  a.add_(b, S());
  EXPECT_EQ(a.to_vector<float>(S()), (std::vector<float>{2.5f, -3.75f, 5}));
  EXPECT_THROW(a.add_(Tensor::zeros({4}, DType::kFloat32, Device::cpu(), S()), S()), InvalidArgument);
}

}  // namespace
}  // namespace ddp
