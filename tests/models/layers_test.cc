// The MLP family's modules on the CPU: PyTorch's state_dict names, initialisation, what each forward computes
// and refuses, gradients of a residual LayerNorm model by finite differences, Dropout's train/eval behaviour and
// its draw counter resumed bit for bit from a training checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/io/loaded_checkpoint.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/training/training_checkpoint.h"
#include "tests/models/residual_model.h"
#include "tests/ops/gradcheck.h"
#include "tests/scratch.h"

namespace ddp {
namespace {

using namespace ddp::test;  // NOLINT(build/namespaces): the gradient-check helpers and the shared model

std::vector<std::string> keys(const NamedTensors& tensors) {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors) out.push_back(name);
  return out;
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(S()); }

TEST(Layers, ResidualModelHasTheStateDictKeysOfTorch) {
  auto model = residual_layer_norm_gelu_model(1, Device::cpu(), S());
  std::vector<std::string> expected{"0.weight", "0.bias"};
  for (const char* block : {"1", "2"}) {
    for (const char* p : {"body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"})
      expected.push_back(std::string(block) + "." + p);
  }
  expected.insert(expected.end(), {"3.weight", "3.bias"});
  EXPECT_EQ(keys(model->state_dict()), expected);
  EXPECT_TRUE(model->named_buffers().empty());
}

TEST(Layers, LayerNormStartsAtOnesAndZeros) {
  LayerNorm norm(6);
  EXPECT_EQ(keys(norm.state_dict()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(values(norm.weight()), std::vector<float>(6, 1.0f));
  EXPECT_EQ(values(norm.bias()), std::vector<float>(6, 0.0f));
  EXPECT_THROW(norm.forward(leaf({2, 5}, 1), S()), InvalidArgument);
}

TEST(Layers, ResidualBlockAddsTheSkipOrItsProjection) {
  auto body = std::make_shared<Linear>(4, 4, true, 2);
  ResidualBlock block(body);
  const Tensor x = leaf({3, 4}, 3);
  autograd::NoGradGuard g;
  const std::vector<float> y = values(block.forward(x, S()));
  const std::vector<float> h = values(body->forward(x, S())), xv = values(x);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], h[i] + xv[i]);

  auto wide = std::make_shared<Linear>(4, 6, true, 4);
  auto projection = std::make_shared<Linear>(4, 6, false, 5);
  ResidualBlock projected(wide, projection);
  EXPECT_EQ(keys(projected.state_dict()), (std::vector<std::string>{"body.weight", "body.bias", "projection.weight"}));
  const std::vector<float> yp = values(projected.forward(x, S()));
  const std::vector<float> hp = values(wide->forward(x, S())), pp = values(projection->forward(x, S()));
  for (std::size_t i = 0; i < yp.size(); ++i) EXPECT_EQ(yp[i], hp[i] + pp[i]);

  ResidualBlock mismatched(wide);
  try {
    mismatched.forward(x, S());
    FAIL() << "a body that changes the width was accepted without a projection";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("(width 6)"), std::string::npos) << what;
    EXPECT_NE(what.find("(width 4)"), std::string::npos) << what;
    EXPECT_NE(what.find("Linear(4, 6)"), std::string::npos) << what;
  }
}

TEST(Layers, ResidualLayerNormModelGradientsByFiniteDifferences) {
  auto model = residual_layer_norm_gelu_model(6, Device::cpu(), S(), 3, 5, 2);
  const Tensor x = Tensor::uniform({4, 3}, -1.0f, 1.0f, 7, 0, Device::cpu(), S());
  const Tensor t = target_like({4, 2});
  gradcheck([&] { return ops::mse_loss(model->forward(x, S()), t, S()); }, model->parameters(),
            "residual layer-norm model", 1e-3);
}

TEST(Layers, FrequencyEncodingReportsItsWidth) {
  FrequencyEncoding with(3, 4), without(3, 4, false);
  EXPECT_EQ(with.out_features(), 27);
  EXPECT_EQ(without.out_features(), 24);
  EXPECT_TRUE(with.state_dict().empty());
  EXPECT_EQ(with.forward(leaf({2, 3}, 8), S()).shape(), (Shape{2, 27}));
  EXPECT_THROW(with.forward(leaf({2, 4}, 8), S()), InvalidArgument);
  EXPECT_THROW(FrequencyEncoding(3, 0, false), InvalidArgument);
}

TEST(Layers, DropoutIsTheIdentityInEvalModeAndDrawsANewMaskEachTrainingForward) {
  Dropout dropout(0.5, 9);
  EXPECT_TRUE(dropout.state_dict().empty()) << "torch's Dropout has no state_dict entries";
  EXPECT_EQ(keys(dropout.named_buffers()), (std::vector<std::string>{"draw"}));
  const Tensor x = Tensor::full({64, 16}, 1.0, DType::kFloat32, Device::cpu(), S());
  const std::vector<float> first = values(dropout.forward(x, S()));
  const std::vector<float> second = values(dropout.forward(x, S()));
  EXPECT_NE(first, second);
  for (float v : first) EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
  EXPECT_EQ(dropout.draw().to_vector<std::int64_t>(S())[0], 2);
  dropout.eval();
  EXPECT_TRUE(dropout.forward(x, S()).same(x));
  EXPECT_EQ(dropout.draw().to_vector<std::int64_t>(S())[0], 2) << "eval mode draws nothing";
  Dropout none(0.0, 9);
  EXPECT_TRUE(none.forward(x, S()).same(x));
  EXPECT_THROW(Dropout(1.0), InvalidArgument);
  // Buffers are found through children, with dotted names.
  Sequential model;
  model.add(std::make_shared<Linear>(4, 4));
  model.add(std::make_shared<Dropout>(0.1, 1));
  EXPECT_EQ(keys(model.named_buffers()), (std::vector<std::string>{"1.draw"}));
}

// A Linear, Dropout, Linear model trained by SGD; its checkpoint after `k` steps restored into a fresh model must
// continue with the same masks: the next step's outputs and the parameters after it, bit for bit.
TEST(Layers, DropoutResumesItsMasksBitwiseFromATrainingCheckpoint) {
  auto build = [](std::uint64_t init_seed) {
    auto model = std::make_shared<Sequential>();
    model->add(std::make_shared<Linear>(4, 16, true, init_seed));
    model->add(std::make_shared<Dropout>(0.4, 77));
    model->add(std::make_shared<Linear>(16, 2, true, init_seed + 1));
    return model;
  };
  const Tensor x = Tensor::uniform({8, 4}, -1.0f, 1.0f, 10, 0, Device::cpu(), S());
  const Tensor t = Tensor::uniform({8, 2}, -1.0f, 1.0f, 11, 0, Device::cpu(), S());
  auto step = [&](Module& model, Optimizer& optimizer) {
    model.zero_grad(S());
    const Tensor y = model.forward(x, S());
    autograd::backward(ops::mse_loss(y, t, S()), S());
    optimizer.step(S());
    return values(y);
  };
  auto original = build(1);
  Sgd optimizer(*original, SgdOptions{0.1, 0.9}, S());
  for (int k = 0; k < 3; ++k) step(*original, optimizer);
  const std::string dir = testing::fresh_scratch_dir("dropout_resume");
  io::CheckpointMetadata where;
  where.step = 3;
  const std::string path = training::save_training_checkpoint(dir, *original, optimizer, where, S());
  const io::LoadedCheckpoint loaded = io::load_checkpoint(path);
  ASSERT_NE(loaded.file.find("buffer.1.draw"), nullptr);
  std::int64_t saved_draw = 0;
  loaded.file.copy_to("buffer.1.draw", DType::kInt64, {1}, &saved_draw);
  EXPECT_EQ(saved_draw, 3);

  auto resumed = build(2);  // other initial weights: the checkpoint must bring them
  Sgd resumed_optimizer(*resumed, SgdOptions{0.1, 0.9}, S());
  training::restore_training_checkpoint(path, *resumed, resumed_optimizer, S());
  EXPECT_EQ(dynamic_cast<const Dropout&>((*resumed)[1]).draw().to_vector<std::int64_t>(S())[0], 3);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(step(*resumed, resumed_optimizer), step(*original, optimizer)) << "step " << 3 + k;
  }
  EXPECT_EQ(values(resumed->parameter_store()->flat_params()), values(original->parameter_store()->flat_params()));

  // A checkpoint without buffers (the same parameters, ReLU where the Dropout is) still loads; the draw stays.
  auto plain = std::make_shared<Sequential>();
  plain->add(std::make_shared<Linear>(4, 16, true, 5));
  plain->add(std::make_shared<ActivationLayer>(Activation::kRelu));
  plain->add(std::make_shared<Linear>(16, 2, true, 6));
  Sgd plain_optimizer(*plain, SgdOptions{0.1, 0.9}, S());
  step(*plain, plain_optimizer);
  const std::string plain_path =
      training::save_training_checkpoint(testing::fresh_scratch_dir("no_buffers"), *plain, plain_optimizer, where, S());
  training::restore_training_checkpoint(plain_path, *resumed, resumed_optimizer, S());
  EXPECT_EQ(dynamic_cast<const Dropout&>((*resumed)[1]).draw().to_vector<std::int64_t>(S())[0], 5);
  EXPECT_EQ(values(resumed->state_dict()[0].second), values(plain->state_dict()[0].second));
}

TEST(Layers, EmbeddingIsInitialisedFromTheStandardNormal) {
  Embedding table(100, 50, 3, 7);
  EXPECT_EQ(keys(table.state_dict()), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(values(table.weight()), values(Tensor::normal({100, 50}, 0.0f, 1.0f, 3, 7, Device::cpu(), S())));
  double sum = 0, squares = 0;
  for (float v : values(table.weight())) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  const double n = 5000, mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n));
  EXPECT_NEAR(squares / n - mean * mean, 1.0, 0.1);
  const Tensor rows = table.forward(Tensor::from_int32({99, 0}, {2}, Device::cpu(), S()), S());
  EXPECT_EQ(rows.shape(), (Shape{2, 50}));
}

TEST(Layers, CategoricalFeaturesEmbedTheIdColumnsBesideTheFloatFeatures) {
  CategoricalFeatures features({3, 5}, 2, 4);
  EXPECT_EQ(keys(features.state_dict()), (std::vector<std::string>{"embeddings.0.weight", "embeddings.1.weight"}));
  EXPECT_EQ(features.out_features(5), 2 * 2 + 3);
  // Rows: (id0, id1, f0, f1, f2).
  const Tensor x = Tensor::from_vector({2, 4, 0.5f, -1, 3,  //
                                        0, 0, 1.5f, 2, -3,  //
                                        1, 3, 0.0f, 0, 1},
                                       {3, 5}, Device::cpu(), S());
  const std::vector<float> e0 = values(features.embeddings()[0].state_dict()[0].second);
  const std::vector<float> e1 = values(features.embeddings()[1].state_dict()[0].second);
  const std::vector<float> xv = values(x);
  {
    autograd::NoGradGuard g;
    const std::vector<float> y = values(features.forward(x, S()));
    ASSERT_EQ(y.size(), 3u * 7u);
    for (int r = 0; r < 3; ++r) {
      const auto id0 = static_cast<int>(xv[r * 5]), id1 = static_cast<int>(xv[r * 5 + 1]);
      const std::vector<float> expected{e0[id0 * 2], e0[id0 * 2 + 1], e1[id1 * 2], e1[id1 * 2 + 1],
                                        xv[r * 5 + 2], xv[r * 5 + 3], xv[r * 5 + 4]};
      EXPECT_EQ(std::vector<float>(y.begin() + r * 7, y.begin() + r * 7 + 7), expected) << "row " << r;
    }
  }
  const Tensor t = target_like({3, 7});
  gradcheck([&] { return ops::mse_loss(features.forward(x, S()), t, S()); }, features.parameters(),
            "categorical features");
  const Tensor bad = Tensor::from_vector({2, 5, 0, 0, 0}, {1, 5}, Device::cpu(), S());
  try {
    features.forward(bad, S());
    FAIL() << "id 5 of a column of 5 categories was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("row 0, column 1 holds 5.000000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(features.forward(Tensor::zeros({2, 1}, DType::kFloat32, Device::cpu(), S()), S()), InvalidArgument);
  ModuleList list;
  EXPECT_THROW(list.forward(x, S()), InvalidArgument);
}

}  // namespace
}  // namespace ddp
