// Models on the CPU: PyTorch state-dict names, PyTorch's default Linear initialisation, load_state_dict
// checks, and a few SGD training steps of an MLP against the same computation in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/models/bf16_weights.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

namespace ddp {
namespace {

using ddp::Activation;
const Stream& S() { return cpu_stream(); }

TEST(Models, StateDictNamesMatchNnSequential) {
  MLP model({784, 256, 128, 10}, Activation::kRelu, 0);
  std::vector<std::string> names;
  for (const auto& [n, t] : model.state_dict()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(model.state_dict()[2].second.shape(), (Shape{128, 256}));
  EXPECT_EQ(model.size(), 5u);
  EXPECT_EQ(model[1].type_name(), "ReLU");
  EXPECT_EQ(model.num_parameters(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(Models, TanhAndSigmoidMlpsRunTheirActivationsAsLayersOfTheirOwn) {
  for (Activation act : {Activation::kTanh, Activation::kSigmoid}) {
    MLP model({3, 5, 2}, act, 4);
    EXPECT_EQ(model[1].type_name(), act == Activation::kTanh ? "Tanh" : "Sigmoid");
    const Tensor x = Tensor::from_vector({0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -0.75f}, {2, 3}, Device::cpu(), S());
    autograd::NoGradGuard no_grad;
    const auto& l0 = dynamic_cast<Linear&>(model[0]);
    const auto& l2 = dynamic_cast<Linear&>(model[2]);
    const Tensor by_hand = ops::linear(ops::activation(ops::linear(x, l0.weight(), l0.bias(), Activation::kNone, S()),
                                                       act, S()),
                                       l2.weight(), l2.bias(), Activation::kNone, S());
    EXPECT_EQ(model.forward(x, S()).to_vector<float>(S()), by_hand.to_vector<float>(S()));
  }
}

TEST(Models, LinearUsesPytorchDefaultInit) {
  Linear layer(100, 30, true, 5);
  const float bound = 1.0f / std::sqrt(100.0f);
  for (const Tensor* t : {&layer.weight(), &layer.bias()}) {
    std::vector<float> v = t->to_vector<float>(S());
    float lo = 1, hi = -1;
    for (float x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    if (v.size() > 1000) {  // the weight fills its range
      EXPECT_LT(lo, -0.95f * bound);
      EXPECT_GT(hi, 0.95f * bound);
    }
  }
  // Same seed, same model; MLP layers draw from distinct counters.
  Linear again(100, 30, true, 5);
  EXPECT_EQ(again.weight().to_vector<float>(S()), layer.weight().to_vector<float>(S()));
  MLP m({10, 10, 10}, Activation::kRelu, 5);
  EXPECT_NE(m.state_dict()[0].second.to_vector<float>(S()), m.state_dict()[2].second.to_vector<float>(S()));
}

TEST(Models, LoadStateDictChecksNamesAndShapes) {
  MLP a({4, 3, 2}, Activation::kGelu, 1), b({4, 3, 2}, Activation::kGelu, 2);
  b.load_state_dict(a.state_dict(), S());
  EXPECT_EQ(b.state_dict()[0].second.to_vector<float>(S()), a.state_dict()[0].second.to_vector<float>(S()));
  MLP c({4, 5, 2}, Activation::kGelu, 1);
  EXPECT_THROW(c.load_state_dict(a.state_dict(), S()), Error);
  NamedTensors missing = a.state_dict();
  missing.pop_back();
  EXPECT_THROW(b.load_state_dict(missing, S()), Error);
  // Works on flattened parameters too (copies into the views).
  b.flatten_parameters(S());
  b.load_state_dict(MLP({4, 3, 2}, Activation::kGelu, 9).state_dict(), S());
  EXPECT_TRUE(b.state_dict()[0].second.shares_storage_with(b.parameter_store()->flat_params()));
}

// A module's store is one object for its life: flattening again re-lays it in place (values kept, a new
// layout_version), so an optimizer holding it follows or refuses instead of holding a dangling reference; a
// bf16 copy made for the old layout refuses to be used.
TEST(Models, FlatteningAgainReLaysTheSameStoreInPlace) {
  MLP model({3, 4, 2}, Activation::kRelu, 1, Device::cpu(), S());
  ParameterStore& store = model.flat_parameters(S());
  EXPECT_EQ(&model.flat_parameters(S()), &store);  // made once
  const std::vector<float> weight = model.parameters().front().to_vector<float>(S());
  const std::int64_t version = store.layout_version();
  Bf16Weights copy(store, S());
  Sgd optimizer(model, SgdOptions{}, S());
  EXPECT_EQ(&optimizer.store(), &store);
  EXPECT_EQ(&model.flatten_parameters(S(), {3, 2, 1, 0}), &store);
  EXPECT_GT(store.layout_version(), version);
  EXPECT_EQ(store.slot(0).offset, store.slot(1).offset + 16);  // parameter 0 now after parameter 1 (4 values, padded)
  EXPECT_EQ(model.parameters().front().to_vector<float>(S()), weight);
  EXPECT_THROW(copy.refresh(S()), InvalidArgument);
  // The optimizer had not stepped: it follows the new layout.
  const Tensor x = Tensor::uniform({5, 3}, -1.0f, 1.0f, 2, 0, Device::cpu(), S());
  const Tensor y = Tensor::from_int32({0, 1, 1, 0, 1}, {5}, Device::cpu(), S());
  model.zero_grad(S());
  autograd::backward(ops::cross_entropy(model.forward(x, S()), y, S()), S());
  EXPECT_NO_THROW(optimizer.step(S()));
  EXPECT_NE(model.parameters().front().to_vector<float>(S()), weight);
}

TEST(Models, TrainEvalPropagates) {
  MLP m({4, 3, 2});
  EXPECT_TRUE(m.is_training());
  m.eval();
  EXPECT_FALSE(m[0].is_training());
  m.train();
  EXPECT_TRUE(m[2].is_training());
}

// ---- The double-precision reference MLP ----
struct RefLayer {
  int in, out;
  std::vector<double> w, b;  // w[o*in + i]
};

double act_f(Activation a, double z) {
  if (a == Activation::kRelu) return z > 0 ? z : 0;
  return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
}
double act_g(Activation a, double z) {
  if (a == Activation::kRelu) return z > 0 ? 1 : 0;
  const double cdf = 0.5 * (1 + std::erf(z / std::sqrt(2.0)));
  return cdf + z * std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
}

// One forward + cross-entropy + backward + SGD(momentum, weight decay) step; returns the loss.
double ref_step(std::vector<RefLayer>& L, std::vector<std::vector<double>>& mw, std::vector<std::vector<double>>& mb,
                const std::vector<float>& x, const std::vector<int>& y, int batch, Activation act, double lr,
                double mu, double wd, bool first) {
  const std::size_t n = L.size();
  std::vector<std::vector<double>> h(n + 1), z(n);
  h[0].assign(x.begin(), x.end());
  for (std::size_t k = 0; k < n; ++k) {
    const RefLayer& l = L[k];
    z[k].assign(static_cast<std::size_t>(batch * l.out), 0);
    h[k + 1].assign(z[k].size(), 0);
    for (int r = 0; r < batch; ++r)
      for (int o = 0; o < l.out; ++o) {
        double s = l.b[o];
        for (int i = 0; i < l.in; ++i) s += h[k][r * l.in + i] * l.w[o * l.in + i];
        z[k][r * l.out + o] = s;
        h[k + 1][r * l.out + o] = k + 1 < n ? act_f(act, s) : s;
      }
  }
  const int C = L.back().out;
  double loss = 0;
  std::vector<double> d(static_cast<std::size_t>(batch * C));
  for (int r = 0; r < batch; ++r) {
    double m = -1e300, s = 0;
    for (int c = 0; c < C; ++c) m = std::max(m, h[n][r * C + c]);
    for (int c = 0; c < C; ++c) s += std::exp(h[n][r * C + c] - m);
    loss += std::log(s) + m - h[n][r * C + y[r]];
    for (int c = 0; c < C; ++c) d[r * C + c] = (std::exp(h[n][r * C + c] - m) / s - (c == y[r])) / batch;
  }
  loss /= batch;
  for (std::size_t k = n; k-- > 0;) {
    RefLayer& l = L[k];
    if (k + 1 < n)
      for (std::size_t i = 0; i < d.size(); ++i) d[i] *= act_g(act, z[k][i]);
    std::vector<double> gw(l.w.size(), 0), gb(l.b.size(), 0), dx(static_cast<std::size_t>(batch * l.in), 0);
    for (int r = 0; r < batch; ++r)
      for (int o = 0; o < l.out; ++o) {
        const double g = d[r * l.out + o];
        gb[o] += g;
        for (int i = 0; i < l.in; ++i) {
          gw[o * l.in + i] += g * h[k][r * l.in + i];
          dx[r * l.in + i] += g * l.w[o * l.in + i];
        }
      }
    auto sgd = [&](std::vector<double>& p, const std::vector<double>& g, std::vector<double>& buf) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = g[i] + wd * p[i];
        buf[i] = first ? gi : mu * buf[i] + gi;
        p[i] -= lr * buf[i];
      }
    };
    sgd(l.w, gw, mw[k]);
    sgd(l.b, gb, mb[k]);
    d = dx;
  }
  return loss;
}

// A double-precision copy of an MLP's parameters (nn.Sequential order: weight, bias per layer) with zeroed SGD
// momentum, for ref_step.
struct RefModel {
  std::vector<RefLayer> layers;
  std::vector<std::vector<double>> mw, mb;
};

RefModel reference_of(const NamedTensors& params, const std::vector<std::int64_t>& sizes) {
  RefModel m;
  for (std::size_t k = 0; k + 1 < sizes.size(); ++k) {
    RefLayer l{static_cast<int>(sizes[k]), static_cast<int>(sizes[k + 1]), {}, {}};
    for (float v : params[2 * k].second.to_vector<float>(S())) l.w.push_back(v);
    for (float v : params[2 * k + 1].second.to_vector<float>(S())) l.b.push_back(v);
    m.mw.emplace_back(l.w.size(), 0.0);
    m.mb.emplace_back(l.b.size(), 0.0);
    m.layers.push_back(l);
  }
  return m;
}

TEST(Models, MlpTrainingMatchesDoublePrecision) {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    const std::vector<std::int64_t> sizes{6, 8, 5, 3};
    const int batch = 4;
    MLP model(sizes, act, 42);
    ParameterStore& store = model.flatten_parameters(S(), {5, 4, 3, 2, 1, 0});
    SgdOptions opt;
    opt.lr = 0.1f;
    opt.momentum = 0.9f;
    opt.weight_decay = 1e-3f;
    Sgd sgd(store, opt, S());

    const NamedTensors params = model.named_parameters();
    RefModel reference = reference_of(params, sizes);
    std::vector<RefLayer>& ref = reference.layers;
    std::vector<std::vector<double>>&mw = reference.mw, &mb = reference.mb;
    for (int step = 0; step < 4; ++step) {
      Tensor x = Tensor::uniform({batch, 6}, -2.0f, 2.0f, 100 + step, 0, Device::cpu(), S());
      std::vector<int> y{step % 3, 1, 2, 0};
      Tensor labels = Tensor::from_int32({y[0], y[1], y[2], y[3]}, {batch}, Device::cpu(), S());
      model.zero_grad(S());
      Tensor loss = ops::cross_entropy(model.forward(x, S()), labels, S());
      const float loss_value = loss.to_vector<float>(S())[0];
      autograd::backward(loss, S());
      sgd.step(S());
      const double ref_loss = ref_step(ref, mw, mb, x.to_vector<float>(S()), y, batch, act, 0.1, 0.9, 1e-3, step == 0);
      EXPECT_NEAR(loss_value, ref_loss, 1e-5 * std::max(1.0, std::abs(ref_loss))) << "step " << step;
    }
    // float32 vs double after 4 steps: parameters ~0.3, errors ~1e-7 per op, a few hundred ops deep.
    for (std::size_t k = 0; k < ref.size(); ++k) {
      std::vector<float> w = params[2 * k].second.to_vector<float>(S());
      std::vector<float> b = params[2 * k + 1].second.to_vector<float>(S());
      for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[k].w[i], 2e-5) << "layer " << k;
      for (std::size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], ref[k].b[i], 2e-5) << "layer " << k;
    }
  }
}

// Mixed precision as step_bench runs it: forward_bf16 (bf16 GEMMs, bfloat16 or float32 logits, float32 gradients
// written into the masters), the optimizer refreshing the bf16 copy in its own pass. Against the double
// reference the steps agree to bf16 precision; the copy equals the rounded masters bit for bit after every step;
// every master's grad-ready hook (what DDP's reducer listens to) fires once per backward.
void bf16_steps(DType logits_dtype) {
  const std::vector<std::int64_t> sizes{6, 8, 5, 3};
  const int batch = 4;
  MLP model(sizes, Activation::kRelu, 42);
  ParameterStore& store = model.flatten_parameters(S(), {5, 4, 3, 2, 1, 0});
  Sgd sgd(store, SgdOptions{0.1, 0.9, 0.0, 1e-3, false}, S());
  Bf16Weights weights(store, S());
  sgd.set_bf16_copy(weights.flat());
  int hooks_fired = 0;
  store.add_grad_ready_hook([&](std::size_t) { ++hooks_fired; });

  const NamedTensors params = model.named_parameters();
  RefModel reference = reference_of(params, sizes);
  std::vector<RefLayer>& ref = reference.layers;
  std::vector<std::vector<double>>&mw = reference.mw, &mb = reference.mb;
  const int steps = 4;
  for (int step = 0; step < steps; ++step) {
    Tensor x = Tensor::uniform({batch, 6}, -2.0f, 2.0f, 100 + step, 0, Device::cpu(), S());
    std::vector<int> y{step % 3, 1, 2, 0};
    Tensor labels = Tensor::from_int32({y[0], y[1], y[2], y[3]}, {batch}, Device::cpu(), S());
    model.zero_grad(S());
    Tensor logits = forward_bf16(model, weights, x, S(), logits_dtype);
    ASSERT_EQ(logits.dtype(), logits_dtype);
    Tensor loss = ops::cross_entropy(logits, labels, S());
    const float loss_value = loss.to_vector<float>(S())[0];
    autograd::backward(loss, S());
    sgd.step(S());
    const double ref_loss = ref_step(ref, mw, mb, x.to_vector<float>(S()), y, batch, Activation::kRelu, 0.1, 0.9,
                                     1e-3, step == 0);
    // bf16 operands: ~2^-9 relative per rounding, a handful of roundings deep.
    EXPECT_NEAR(loss_value, ref_loss, 2e-2 * std::max(1.0, std::abs(ref_loss))) << "step " << step;

    const Tensor rounded = store.flat_params().to_dtype(DType::kBFloat16, S());
    const auto* want = static_cast<const std::uint16_t*>(rounded.data_ptr());
    const auto* got = static_cast<const std::uint16_t*>(weights.flat().data_ptr());
    for (std::int64_t i = 0; i < store.total_numel(); ++i)
      ASSERT_EQ(got[i], want[i]) << "bf16 copy element " << i << " after step " << step;
  }
  EXPECT_EQ(hooks_fired, steps * static_cast<int>(params.size()));
  for (std::size_t k = 0; k < ref.size(); ++k) {
    std::vector<float> w = params[2 * k].second.to_vector<float>(S());
    std::vector<float> b = params[2 * k + 1].second.to_vector<float>(S());
    for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[k].w[i], 1e-2) << "layer " << k;
    for (std::size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], ref[k].b[i], 1e-2) << "layer " << k;
  }
}

TEST(Models, Bf16MixedPrecisionStepsTrackDoublePrecision) {
  for (DType logits_dtype : {DType::kBFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string("logits ") + dtype_name(logits_dtype));
    bf16_steps(logits_dtype);
  }
}

}  // namespace
}  // namespace ddp
