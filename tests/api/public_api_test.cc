// The public API as a user program sees it, through "ddp.h" and the public headers it names for the parts
// outside a plain loop (the loader, checkpoints; nothing internal): the Session's set-up and host collectives,
// DistributedDataParallel built from a model with the optimizer made before or after it (and the orders that
// cannot work refused with a message), a loader batch on the device in one call, and a training checkpoint
// saved and restored through the Session. Runs as 1 and 2 ranks (each test builds Sessions of its own, which
// join the MPI the test main started).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ddp.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"
#include "runtime/data/sampler.h"
#include "runtime/io/checkpoint.h"
#include "runtime/training/training_checkpoint.h"
#include "tests/error_message.h"
#include "tests/scratch.h"

namespace {

using ::ddp::testing::error_message;

using ddp::Tensor;

TEST(Session, SetsUpTheDeviceStreamBackendAndHostCollectives) {
  ddp::Session session(nullptr, nullptr);
  EXPECT_GE(session.rank(), 0);
  EXPECT_LT(session.rank(), session.size());
  EXPECT_EQ(session.is_lead(), session.rank() == 0);
  EXPECT_EQ(session.stream().device(), session.device());
  EXPECT_EQ(&ddp::current_stream(), &session.stream());  // what every call's stream defaults to
  if (std::getenv("DDP_BACKEND") == nullptr) {
    EXPECT_EQ(session.backend(), session.device().is_cuda() ? ddp::Backend::kNccl : ddp::Backend::kMpi);
  }
  if (session.device().is_cpu()) {
    EXPECT_GE(session.cpu_threads(), 1);
  }
  const int n = session.size();
  EXPECT_EQ(session.sum(session.rank() + 1.0), n * (n + 1) / 2.0);
  EXPECT_EQ(session.mean(2.0 * session.rank()), n - 1.0);
  EXPECT_EQ(session.max(session.rank()), n - 1.0);
  EXPECT_TRUE(session.any(session.rank() == n - 1));
  EXPECT_FALSE(session.any(false));
  EXPECT_EQ(session.sum(std::vector<double>{1.0, static_cast<double>(session.rank())}),
            (std::vector<double>{static_cast<double>(n), n * (n - 1) / 2.0}));
  EXPECT_EQ(session.group().size(), n);
  EXPECT_EQ(&session.group(), &session.group());  // made once
}

TEST(Session, ItsStreamIsCurrentWhileItLivesAndTheCpuStreamAfter) {
  {
    ddp::Session session(nullptr, nullptr);
    EXPECT_EQ(&ddp::current_stream(), &session.stream());
    ddp::Stream second = ddp::Stream::create(session.device());
    {
      ddp::StreamGuard guard(second);
      EXPECT_EQ(&ddp::current_stream(), &second);
    }
    EXPECT_EQ(&ddp::current_stream(), &session.stream());
  }
  EXPECT_EQ(&ddp::current_stream(), &ddp::cpu_stream());
}

TEST(Session, RefusesAnUnknownBackendOnEveryRank) {
  ddp::SessionOptions options;
  options.backend = "gloo";
  const std::string error = error_message<std::exception>([&] { ddp::Session session(nullptr, nullptr, options); });
  EXPECT_NE(error.find("bad backend:"), std::string::npos) << error;
  EXPECT_NE(error.find("unknown backend 'gloo'"), std::string::npos) << error;
}

TEST(Session, RefusesNcclOnTheCpu) {
  ddp::SessionOptions options;
  options.device = ddp::DeviceRequest::kCpu;
  options.backend = "nccl";
  const std::string error = error_message<std::exception>([&] { ddp::Session session(nullptr, nullptr, options); });
  EXPECT_NE(error.find("the NCCL backend needs CUDA devices, but this rank runs on cpu"), std::string::npos)
      << error;
}

TEST(Session, WithoutAProcessGroupSaysSo) {
  ddp::SessionOptions options;
  options.process_group = false;
  ddp::Session session(nullptr, nullptr, options);
  EXPECT_EQ(session.sum(1.0), session.size());
  const std::string error = error_message<std::exception>([&] { session.group(); });
  EXPECT_NE(error.find("SessionOptions::process_group = false"), std::string::npos) << error;
}

// A few training steps on rank-dependent data; returns the parameters in registration order.
template <typename Build>
std::vector<float> train(ddp::Session& session, Build build_ddp_and_optimizer, int steps = 3) {
  const ddp::Stream& stream = session.stream();
  // A different seed per rank: DDP's broadcast of rank 0's parameters is what makes the ranks agree.
  ddp::MLP model({6, 8, 3}, ddp::Activation::kGelu, 7 + 100 * session.rank(), session.device(), stream);
  auto [ddp_model, optimizer] = build_ddp_and_optimizer(model);
  const Tensor x = Tensor::normal({4, 6}, 0.0f, 1.0f, 3, 24 * session.rank(), session.device(), stream);
  const Tensor y = Tensor::from_int32({0, 2, 1, 2}, {4}, session.device(), stream);
  for (int s = 0; s < steps; ++s) {
    model.zero_grad(stream);
    ddp_model->backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream));
    optimizer->step(stream);
  }
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector<float>(stream);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(DistributedDataParallel, FromAModelWithTheOptimizerBeforeOrAfterIt) {
  ddp::Session session(nullptr, nullptr);
  const ddp::Stream& stream = session.stream();
  using Pair = std::pair<std::unique_ptr<ddp::DistributedDataParallel>, std::unique_ptr<ddp::Optimizer>>;
  const std::vector<float> ddp_first = train(session, [&](ddp::MLP& model) {
    auto d = std::make_unique<ddp::DistributedDataParallel>(model, session);
    auto o = std::make_unique<ddp::AdamW>(model, ddp::AdamWOptions{}, stream);
    return Pair(std::move(d), std::move(o));
  });
  const std::vector<float> optimizer_first = train(session, [&](ddp::MLP& model) {
    auto o = std::make_unique<ddp::AdamW>(model, ddp::AdamWOptions{}, stream);
    auto d = std::make_unique<ddp::DistributedDataParallel>(model, session);
    return Pair(std::move(d), std::move(o));
  });
  EXPECT_EQ(ddp_first, optimizer_first);
  // Every rank holds the same parameters.
  for (float v : {ddp_first.front(), ddp_first.back()}) EXPECT_EQ(session.max(v), session.sum(v) / session.size());
}

TEST(DistributedDataParallel, OrdersThatCannotWorkAreRefusedSayingWhatToDo) {
  ddp::Session session(nullptr, nullptr);
  const ddp::Stream& stream = session.stream();
  const Tensor x = Tensor::normal({4, 6}, 0.0f, 1.0f, 3, 0, session.device(), stream);
  const Tensor y = Tensor::from_int32({0, 2, 1, 2}, {4}, session.device(), stream);

  // An optimizer that stepped before DDP re-laid the parameters out.
  ddp::MLP stepped({6, 8, 3}, ddp::Activation::kRelu, 1, session.device(), stream);
  ddp::Sgd sgd(stepped, ddp::SgdOptions{}, stream);
  stepped.zero_grad(stream);
  ddp::autograd::backward(ddp::ops::cross_entropy(stepped.forward(x, stream), y, stream), stream);
  sgd.step(stream);
  ddp::DistributedDataParallel late(stepped, session);
  std::string error = error_message<std::exception>([&] { sgd.step(stream); });
  EXPECT_NE(error.find("construct DistributedDataParallel before stepping the optimizer"), std::string::npos)
      << error;

  // Flattening again after DDP: its buckets would be slices of the old buffers.
  ddp::MLP model({6, 8, 3}, ddp::Activation::kRelu, 2, session.device(), stream);
  ddp::DistributedDataParallel ddp_model(model, session);
  model.flatten_parameters(stream);
  model.zero_grad(stream);
  error = error_message<std::exception>(
      [&] { ddp_model.backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream)); });
  ddp::autograd::clear_tape();
  EXPECT_NE(error.find("flattened again after DistributedDataParallel was constructed"), std::string::npos) << error;
}

TEST(Data, ABatchReachesTheDeviceInOneCall) {
  ddp::Session session(nullptr, nullptr);
  ddp::data::Dataset data;
  data.size = 10;
  data.feature_count = 3;
  data.num_classes = 4;
  for (int i = 0; i < 30; ++i) data.features.push_back(0.5f * i);
  for (int i = 0; i < 10; ++i) data.labels.push_back(i % 4);
  ddp::data::SamplerOptions so;
  so.dataset_size = data.size;
  so.num_replicas = session.size();
  so.rank = session.rank();
  ddp::data::LoaderOptions lo;
  lo.batch_size = 2;
  ddp::data::BatchLoader loader(ddp::data::view(data), ddp::data::DistributedSampler(so), lo);
  loader.start_epoch(0);
  const ddp::data::Batch* batch = loader.next();
  ASSERT_NE(batch, nullptr);
  auto [x, y] = ddp::data::to_device(*batch, session.device(), session.stream());
  EXPECT_EQ(x.shape(), (ddp::Shape{2, 3}));
  EXPECT_EQ(x.device(), session.device());
  const std::vector<float> xs = x.to_vector<float>(session.stream());
  const std::vector<std::int32_t> ys = y.to_vector<std::int32_t>(session.stream());
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = (*batch->sample_indices)[r];
    EXPECT_EQ(ys[r], data.labels[row]);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(xs[r * 3 + k], data.features[row * 3 + k]);
  }
}

TEST(Checkpoint, SavedAndRestoredThroughTheSession) {
  ddp::Session session(nullptr, nullptr);
  const ddp::Stream& stream = session.stream();
  // Every rank sees the same directory: Bazel's TEST_TMPDIR, or /tmp on the GPU machine (tools/gpu_jobs.txt).
  const std::string dir = ddp::testing::scratch_path("ddp_public_api_test_checkpoints");

  ddp::MLP model({6, 8, 3}, ddp::Activation::kRelu, 4, session.device(), stream);
  ddp::DistributedDataParallel ddp_model(model, session);
  ddp::AdamW optimizer(model, ddp::AdamWOptions{}, stream);
  EXPECT_FALSE(ddp::training::restore_latest_training_checkpoint(session, dir + "/none", model, optimizer));

  const Tensor x = Tensor::normal({4, 6}, 0.0f, 1.0f, 3, 0, session.device(), stream);
  const Tensor y = Tensor::from_int32({0, 2, 1, 2}, {4}, session.device(), stream);
  auto step = [&] {
    model.zero_grad(stream);
    ddp_model.backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream));
    optimizer.step(stream);
  };
  step();
  step();
  ddp::io::CheckpointMetadata where;
  where.step = 2;
  where.epoch = 1;
  where.sampler_position = 8;
  where.seed = 4;
  where.extra["run.note"] = "public api";
  ddp::training::save_training_checkpoint(session, dir, model, optimizer, where);
  const std::vector<float> saved = model.parameters().front().to_vector<float>(stream);
  step();  // moves the parameters and the optimizer on
  ASSERT_NE(model.parameters().front().to_vector<float>(stream), saved);

  const auto restored = ddp::training::restore_latest_training_checkpoint(session, dir, model, optimizer);
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->path, dir + "/ckpt-00000002.safetensors");
  EXPECT_EQ(restored->metadata.step, 2);
  EXPECT_EQ(restored->metadata.epoch, 1);
  EXPECT_EQ(restored->metadata.sampler_position, 8);
  EXPECT_EQ(restored->metadata.world_size, session.size());
  EXPECT_EQ(restored->metadata.extra.at("run.note"), "public api");
  EXPECT_EQ(optimizer.steps(), 2);
  EXPECT_EQ(model.parameters().front().to_vector<float>(stream), saved);
}

// The MLP family's layers by their public names: a model of each kind of layer built and run from "ddp.h".
TEST(Layers, TheMlpFamilyIsPublic) {
  const ddp::Stream& stream = ddp::cpu_stream();
  auto body = std::make_shared<ddp::Sequential>();
  body->add(std::make_shared<ddp::LayerNorm>(10));
  body->add(std::make_shared<ddp::Linear>(10, 10));
  body->add(std::make_shared<ddp::ActivationLayer>(ddp::Activation::kSilu));
  body->add(std::make_shared<ddp::Dropout>(0.1, 3));
  ddp::Sequential model;
  model.add(std::make_shared<ddp::CategoricalFeatures>(std::vector<std::int64_t>{4}, 2));  // 1 + 1 -> 2 + 1
  model.add(std::make_shared<ddp::FrequencyEncoding>(3, 1));                                  // 3 -> 9
  model.add(std::make_shared<ddp::Linear>(9, 10));
  model.add(std::make_shared<ddp::ResidualBlock>(body));
  const Tensor x = Tensor::from_vector({1, 0.5f, 3, -0.5f}, {2, 2}, ddp::Device::cpu(), stream);
  EXPECT_EQ(model.forward(x, stream).shape(), (ddp::Shape{2, 10}));
  EXPECT_EQ(model.named_buffers().front().first, "3.body.3.draw");
}

}  // namespace
