// Autograd on the CPU: grad-ready hooks (once per parameter per backward, right after the gradient is final,
// in the order gradients become final), accumulation across backward calls until zeroed, no-grad mode, and
// the ParameterStore's flat layout (views, given order, relayout) that the DDP reducer relies on.
#include "runtime/autograd/autograd.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/check.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

Tensor batch_input(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  return Tensor::uniform({rows, cols}, -1.0f, 1.0f, seed, 0, Device::cpu(), S());
}

Tensor labels(const std::vector<std::int32_t>& v) {
  return Tensor::from_int32(v, {static_cast<std::int64_t>(v.size())}, Device::cpu(), S());
}

Tensor mlp_loss(MLP& model, std::uint64_t seed) {
  Tensor x = batch_input(4, 6, seed);
  return ops::cross_entropy(model.forward(x, S()), labels({0, 2, 1, 2}), S());
}

TEST(Autograd, HooksFireOncePerParameterInOrderOfFinality) {
  MLP model({6, 8, 5, 3}, Activation::kRelu, 7);
  ParameterStore& store = model.flatten_parameters(S());
  ASSERT_EQ(store.size(), 6u);
  std::vector<std::size_t> order;
  std::vector<std::vector<float>> at_hook(6);
  std::vector<bool> first_layer_done_at_hook(6);
  store.add_grad_ready_hook([&](std::size_t i) {
    order.push_back(i);
    at_hook[i] = store.slot(i).grad.to_vector<float>(S());
    // "As soon as": when the last layer's gradients are final, the first layer's are not computed yet.
    first_layer_done_at_hook[i] = store.slot(0).param.grad_valid();
  });
  autograd::backward(mlp_loss(model, 1), S());
  EXPECT_EQ(order, (std::vector<std::size_t>{4, 5, 2, 3, 0, 1}));
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(at_hook[i], store.slot(i).grad.to_vector<float>(S())) << "gradient changed after its hook, i=" << i;
  }
  EXPECT_FALSE(first_layer_done_at_hook[4]);
  EXPECT_FALSE(first_layer_done_at_hook[2]);
  EXPECT_TRUE(first_layer_done_at_hook[0]);
  EXPECT_EQ(autograd::tape_size(), 0u);

  order.clear();
  autograd::backward(mlp_loss(model, 2), S());  // a second backward fires every hook again, once
  EXPECT_EQ(order.size(), 6u);
}

TEST(Autograd, SharedLeafHookFiresAfterItsLastUse) {
  Tensor w = Tensor::uniform({4, 4}, -0.5f, 0.5f, 3, 0, Device::cpu(), S());
  w.set_requires_grad(true);
  int fired = 0;
  std::vector<float> at_hook;
  w.register_grad_ready_hook([&] {
    ++fired;
    at_hook = w.grad().to_vector<float>(S());
  });
  Tensor x = batch_input(3, 4, 5);
  Tensor h = ops::linear(x, w, Tensor(), Activation::kGelu, S());
  Tensor y = ops::linear(h, w, Tensor(), Activation::kNone, S());
  autograd::backward(ops::mse_loss(y, Tensor::zeros({3, 4}, DType::kFloat32, Device::cpu(), S()), S()), S());
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(at_hook, w.grad().to_vector<float>(S()));  // both uses included
}

// Two graphs whose forwards interleave: each backward consumes its own graph and leaves the other one
// recorded, and both give the gradients they give when run alone.
TEST(Autograd, InterleavedGraphsEachKeepTheirOwnBackward) {
  auto make = [] {
    Tensor w = Tensor::uniform({3, 4}, -0.5f, 0.5f, 9, 0, Device::cpu(), S());
    w.set_requires_grad(true);
    return w;
  };
  auto loss_of = [](const Tensor& w) {
    Tensor y = ops::linear(batch_input(5, 4, 2), w, Tensor(), Activation::kRelu, S());
    return ops::mse_loss(y, Tensor::zeros({5, 3}, DType::kFloat32, Device::cpu(), S()), S());
  };
  Tensor alone = make();
  autograd::backward(loss_of(alone), S());
  const std::vector<float> want = alone.grad().to_vector<float>(S());

  Tensor a = make();
  Tensor b = make();
  Tensor ya = ops::linear(batch_input(5, 4, 2), a, Tensor(), Activation::kRelu, S());
  Tensor yb = ops::linear(batch_input(5, 4, 2), b, Tensor(), Activation::kRelu, S());
  Tensor la = ops::mse_loss(ya, Tensor::zeros({5, 3}, DType::kFloat32, Device::cpu(), S()), S());
  Tensor lb = ops::mse_loss(yb, Tensor::zeros({5, 3}, DType::kFloat32, Device::cpu(), S()), S());
  autograd::backward(la, S());
  autograd::backward(lb, S());
  EXPECT_EQ(a.grad().to_vector<float>(S()), want);
  EXPECT_EQ(b.grad().to_vector<float>(S()), want);
  EXPECT_THROW(autograd::backward(lb, S()), InvalidArgument) << "a graph is consumed by its backward";
}

TEST(Autograd, GradientsAccumulateUntilZeroed) {
  MLP model({6, 8, 3}, Activation::kGelu, 11);
  ParameterStore& store = model.flatten_parameters(S());
  autograd::backward(mlp_loss(model, 1), S());
  const std::vector<float> g1 = store.flat_grads().to_vector<float>(S());
  autograd::backward(mlp_loss(model, 1), S());
  const std::vector<float> g2 = store.flat_grads().to_vector<float>(S());
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g2[i], 2 * g1[i], 1e-6f + 1e-5f * std::abs(g1[i]));
  model.zero_grad(S());
  for (float v : store.flat_grads().to_vector<float>(S())) EXPECT_EQ(v, 0.0f);
  autograd::backward(mlp_loss(model, 1), S());
  EXPECT_EQ(store.flat_grads().to_vector<float>(S()), g1);
}

TEST(Autograd, NoGradRecordsNothing) {
  MLP model({6, 8, 3}, Activation::kRelu, 1);
  {
    autograd::NoGradGuard guard;
    EXPECT_FALSE(autograd::grad_enabled());
    Tensor loss = mlp_loss(model, 3);
    EXPECT_EQ(autograd::tape_size(), 0u);
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_THROW(autograd::backward(loss, S()), Error);
  }
  EXPECT_TRUE(autograd::grad_enabled());
  Tensor loss = mlp_loss(model, 3);
  EXPECT_EQ(autograd::tape_size(), 3u);  // the two linears + cross-entropy
  autograd::clear_tape();
}

TEST(Autograd, BackwardNeedsAScalar) {
  Tensor w = Tensor::uniform({2, 3}, -1, 1, 1, 0, Device::cpu(), S());
  w.set_requires_grad(true);
  Tensor y = ops::linear(batch_input(2, 3, 1), w, Tensor(), Activation::kNone, S());
  EXPECT_THROW(autograd::backward(y, S()), Error);
  autograd::clear_tape();
}

TEST(ParameterStore, ViewsAndLayout) {
  MLP model({6, 8, 3}, Activation::kRelu, 1);
  const NamedTensors before = model.named_parameters();
  std::vector<std::vector<float>> values;
  for (const auto& [n, t] : before) values.push_back(t.to_vector<float>(S()));
  // Reverse registration order, as DDP's buckets.
  ParameterStore& store = model.flatten_parameters(S(), {3, 2, 1, 0});
  // Slots start at multiples of kSlotAlignment (16) elements: 2.bias [3] at 0, 2.weight [3,8] at 16,
  // 0.bias [8] at 48 (16 + 24 rounded up), 0.weight [8,6] at 64 (48 + 8 rounded up), 112 in all.
  EXPECT_EQ(store.total_numel(), 112);
  EXPECT_EQ(store.slot(3).offset, 0);
  EXPECT_EQ(store.slot(2).offset, 16);
  EXPECT_EQ(store.slot(1).offset, 48);
  EXPECT_EQ(store.slot(0).offset, 64);
  EXPECT_EQ(store.slot(0).name, "0.weight");
  EXPECT_EQ(store.slot(3).name, "2.bias");
  EXPECT_EQ(store.slot(2).shape, (Shape{3, 8}));
  const NamedTensors after = model.named_parameters();
  for (std::size_t i = 0; i < after.size(); ++i) {
    const Tensor& p = after[i].second;
    EXPECT_TRUE(p.shares_storage_with(store.flat_params()));
    EXPECT_EQ(p.storage_offset(), store.slot(i).offset);
    EXPECT_TRUE(p.grad().shares_storage_with(store.flat_grads()));
    EXPECT_EQ(p.grad().storage_offset(), store.slot(i).offset);
    EXPECT_EQ(p.to_vector<float>(S()), values[i]) << "values preserved";
    EXPECT_TRUE(p.same(before[i].second)) << "the module's own handles were re-pointed";
  }
  // Backward writes straight into the views: the flat gradient buffer holds every gradient.
  autograd::backward(mlp_loss(model, 4), S());
  const std::vector<float> flat = store.flat_grads().to_vector<float>(S());
  std::vector<float> bias2 = store.slot(3).grad.to_vector<float>(S());
  EXPECT_EQ(std::vector<float>(flat.begin(), flat.begin() + 3), bias2);
  for (std::size_t i = 3; i < 16; ++i) EXPECT_EQ(flat[i], 0.0f) << "padding stays zero";
  // Relayout keeps values and gradients.
  const std::vector<float> w0 = store.slot(0).param.to_vector<float>(S());
  const std::vector<float> gw0 = store.slot(0).grad.to_vector<float>(S());
  store.relayout({0, 1, 2, 3}, S());
  EXPECT_EQ(store.slot(0).offset, 0);
  EXPECT_EQ(model.named_parameters()[0].second.to_vector<float>(S()), w0);
  EXPECT_EQ(model.named_parameters()[0].second.grad().to_vector<float>(S()), gw0);
  EXPECT_THROW(store.relayout({0, 1, 1, 3}, S()), Error);
  EXPECT_THROW(store.relayout({0, 1}, S()), Error);
}

}  // namespace
}  // namespace ddp
