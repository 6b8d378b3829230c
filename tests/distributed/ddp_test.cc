// DistributedDataParallel against a single process: N ranks with batch b each end, after several optimizer
// steps, with the parameters of one model trained on the N·b batch (computed on every rank as the
// reference), for SGD with momentum and for AdamW. Also: no_sync accumulation over k micro-batches equals one
// batch k times larger, the parameters are broadcast from rank 0, models that differ end every rank, and
// parameters a rank did not use are either named in an error or (find_unused_parameters) averaged as zeros.
//
// Tolerance: the reduction order of the gradient (per-rank means, then the average across ranks) differs from
// the single mean over N·b, so values agree to float rounding: relative 2e-5 of the largest parameter after
// 5 steps (FP32 on the CPU and the GPU; the GPU runs exact FP32 GEMMs here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "ddp.h"
#include "runtime/core/allocator.h"
#include "runtime/core/graph.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/reducer.h"
#include "tests/distributed/rank_fixture.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;
using ddp::Activation;

const std::vector<std::int64_t> kSizes = {24, 40, 40, 6};
constexpr std::int64_t kLocalBatch = 8;

// The same global batch on every rank; step s gets its own data.
struct GlobalBatch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};

GlobalBatch make_batch(std::int64_t rows, int step) {
  GlobalBatch b;
  b.x.resize(rows * kSizes.front());
  b.y.resize(rows);
  for (std::size_t i = 0; i < b.x.size(); ++i) b.x[i] = std::sin(0.37f * i + 1.3f * step) * 1.5f;
  for (std::int64_t r = 0; r < rows; ++r) b.y[r] = static_cast<std::int32_t>((r * 7 + step * 3) % kSizes.back());
  return b;
}

// A trunk and two heads, of which forward uses one (`use_b`), plus a head no forward ever uses: the model
// of find_unused_parameters (a branch taken on some ranks only).
class TwoHeads : public Module {
 public:
  TwoHeads(std::uint64_t seed, const Device& device, const Stream& stream) {
    std::uint64_t offset = 0;
    auto layer = [&](const char* name, std::int64_t in, std::int64_t out) {
      auto l = std::make_shared<Linear>(in, out, true, seed, offset, device, stream);
      offset += l->init_counters();
      register_module(name, l);
      return l;
    };
    trunk_ = layer("trunk", kSizes.front(), 40);
    head_a_ = layer("head_a", 40, kSizes.back());
    head_b_ = layer("head_b", 40, kSizes.back());
    layer("never", 40, kSizes.back());
  }
  Tensor forward(const Tensor& x, const Stream& stream) override {
    const Tensor h = trunk_->forward_fused(x, Activation::kRelu, stream);
    return (use_b ? head_b_ : head_a_)->forward(h, stream);
  }
  std::string type_name() const override { return "TwoHeads"; }
  bool use_b = false;

 private:
  std::shared_ptr<Linear> trunk_, head_a_, head_b_;
};

class DdpTest : public ddp::testing::RankTest {
 protected:
  // Rows [begin, begin + count) of `batch` as tensors on the device.
  std::pair<Tensor, Tensor> rows(const GlobalBatch& batch, std::int64_t begin, std::int64_t count) {
    const std::int64_t f = kSizes.front();
    std::vector<float> x(batch.x.begin() + begin * f, batch.x.begin() + (begin + count) * f);
    std::vector<std::int32_t> y(batch.y.begin() + begin, batch.y.begin() + begin + count);
    return {Tensor::from_vector(x, {count, f}, device_, stream_), Tensor::from_int32(y, {count}, device_, stream_)};
  }

  std::vector<float> params(Module& m) { return m.parameter_store()->flat_params().to_vector<float>(stream_); }

  // Parameters in registration order (independent of the flat layout), for comparing two models.
  std::vector<float> ordered(Module& m) {
    std::vector<float> out;
    for (auto& [name, t] : m.named_parameters()) {
      const auto v = t.to_vector<float>(stream_);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // Gradients in registration order (independent of the flat layout).
  std::vector<float> ordered_grads(Module& m) {
    std::vector<float> out;
    const ParameterStore& store = *m.parameter_store();
    for (std::size_t i = 0; i < store.size(); ++i) {
      const auto g = store.slot(i).grad.to_vector<float>(stream_);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  }

  static void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double d = std::abs(static_cast<double>(got[i]) - want[i]);
      if (d > worst) worst = d, at = i;
    }
    EXPECT_LE(worst, rel * scale) << "largest difference " << worst << " at element " << at << " (" << got[at]
                                  << " vs " << want[at] << "), scale " << scale;
  }

  // The whole step (DDP's all-reduces and, with `overlap`, the optimizer's per-bucket waits) captured into a
  // CUDA graph replays the parameters of eager steps bit for bit.
  void check_captured_step_replays_eager_steps(bool overlap);

  template <typename MakeOptimizer>
  void check_equivalence(MakeOptimizer make_optimizer, int steps) {
    // The reference: one process, the whole N·b batch, no DDP.
    MLP reference(kSizes, Activation::kRelu, /*seed=*/11, device_, stream_);
    reference.flatten_parameters(stream_);
    auto ref_opt = make_optimizer(*reference.parameter_store());

    // DDP: a different seed on every rank but 0, so only the broadcast makes them equal.
    MLP model(kSizes, Activation::kRelu, /*seed=*/11 + 1000 * rank_, device_, stream_);
    DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_);
    auto opt = make_optimizer(*model.parameter_store());
    expect_close(ordered(model), ordered(reference), 0.0);

    for (int s = 0; s < steps; ++s) {
      const GlobalBatch batch = make_batch(kLocalBatch * size_, s);
      auto [gx, gy] = rows(batch, 0, kLocalBatch * size_);
      reference.zero_grad(stream_);
      autograd::backward(ops::cross_entropy(reference.forward(gx, stream_), gy, stream_), stream_);
      ref_opt->step(stream_);

      auto [x, y] = rows(batch, rank_ * kLocalBatch, kLocalBatch);
      model.zero_grad(stream_);
      ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
      opt->step(stream_);
    }
    expect_close(ordered(model), ordered(reference), 2e-5);
  }
};

TEST_F(DdpTest, SgdWithMomentumMatchesOneProcessOnTheWholeBatch) {
  check_equivalence(
      [&](ParameterStore& store) {
        SgdOptions o;
        o.lr = 0.1;
        o.momentum = 0.9;
        o.weight_decay = 1e-4;
        return std::make_unique<Sgd>(store, o, stream_);
      },
      5);
}

TEST_F(DdpTest, AdamWMatchesOneProcessOnTheWholeBatch) {
  check_equivalence(
      [&](ParameterStore& store) {
        AdamWOptions o;
        o.lr = 1e-2;
        return std::make_unique<AdamW>(store, o, stream_);
      },
      5);
}

// DdpOptions::overlap_optimizer: the optimizer updates each bucket once its own all-reduce is done. The same
// kernels on the same gradients: the same bits as the ordinary step, with a gradient norm clipped between
// backward and step (clip_grad_norm waits for every bucket), with bfloat16 compression (its decompression runs
// at each bucket's wait), and after a step whose optimizer was skipped (zero_grad waits).
TEST_F(DdpTest, TheOverlappedOptimizerGivesTheBitsOfTheOrdinaryStep) {
  for (GradientCompression compression : {GradientCompression::kNone, GradientCompression::kBFloat16}) {
    for (bool adamw : {false, true}) {
      auto run = [&](bool overlap, std::vector<double>* norms) {
        DdpOptions options;
        options.first_bucket_cap_mb = 0.001;  // several buckets
        options.bucket_cap_mb = 0.004;
        options.compression = compression;
        options.overlap_optimizer = overlap;
        MLP model(kSizes, Activation::kRelu, 9, device_, stream_);
        DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
        EXPECT_GT(ddp.plan().buckets.size(), 2u);
        std::unique_ptr<Optimizer> optimizer;
        if (adamw) {
          optimizer = std::make_unique<AdamW>(*model.parameter_store(), AdamWOptions{.lr = 1e-2}, stream_);
        } else {
          optimizer = std::make_unique<Sgd>(*model.parameter_store(), SgdOptions{.lr = 0.1, .momentum = 0.9}, stream_);
        }
        for (int s = 0; s < 5; ++s) {
          auto [x, y] = rows(make_batch(kLocalBatch * size_, s), rank_ * kLocalBatch, kLocalBatch);
          model.zero_grad(stream_);
          ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
          if (s == 1) continue;  // a skipped step: the next zero_grad must wait for its all-reduces
          if (s == 2) norms->push_back(clip_grad_norm(*model.parameter_store(), 0.5, stream_));
          optimizer->step(stream_);
        }
        return ordered(model);
      };
      std::vector<double> plain_norms, overlapped_norms;
      const std::vector<float> plain = run(false, &plain_norms);
      const std::vector<float> overlapped = run(true, &overlapped_norms);
      EXPECT_EQ(overlapped, plain) << (adamw ? "AdamW" : "SGD") << ", compression "
                                   << (compression == GradientCompression::kNone ? "off" : "bf16");
      EXPECT_EQ(overlapped_norms, plain_norms);
    }
  }
}

TEST_F(DdpTest, TheOverlappedOptimizerRefusesShardingAndJoin) {
  MLP model(kSizes, Activation::kRelu, 9, device_, stream_);
  DdpOptions options;
  options.overlap_optimizer = true;
  options.shard_optimizer = true;
  EXPECT_THROW(DistributedDataParallel(model.flatten_parameters(stream_), *group_, test_world(), stream_, options),
               InvalidArgument);
  options.shard_optimizer = false;
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
  EXPECT_THROW(ddp.join([] {}), InvalidArgument);
}

TEST_F(DdpTest, NoSyncAccumulationEqualsOneLargerBatch) {
  constexpr int k = 3;
  MLP reference(kSizes, Activation::kRelu, 5, device_, stream_);
  reference.flatten_parameters(stream_);
  MLP model(kSizes, Activation::kRelu, 5, device_, stream_);
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_);

  // k micro-batches of b rows per rank; the reference sees all k·N·b rows at once.
  const GlobalBatch batch = make_batch(k * kLocalBatch * size_, 0);
  model.zero_grad(stream_);
  for (int m = 0; m < k; ++m) {
    // Micro-batch m of rank r: rows (m·N + r)·b ... — any partition works, this one interleaves ranks.
    auto [x, y] = rows(batch, (m * size_ + rank_) * kLocalBatch, kLocalBatch);
    Tensor loss = ops::cross_entropy(model.forward(x, stream_), y, stream_);
    if (m + 1 < k) {
      auto guard = ddp.no_sync();
      ddp.backward(loss);
    } else {
      ddp.backward(loss);
    }
  }
  auto [gx, gy] = rows(batch, 0, k * kLocalBatch * size_);
  reference.zero_grad(stream_);
  autograd::backward(ops::cross_entropy(reference.forward(gx, stream_), gy, stream_), stream_);

  // Summed micro-batch means = k × the mean over the k-times larger batch.
  std::vector<float> want = ordered_grads(reference);
  for (float& v : want) v *= k;
  expect_close(ordered_grads(model), want, 2e-5);
}

TEST_F(DdpTest, ModelsThatDifferEndEveryRankWithTheParameterNamed) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<std::int64_t> sizes = kSizes;
  if (rank_ == size_ - 1) sizes[2] = 41;
  MLP model(sizes, Activation::kRelu, 1, device_, stream_);
  try {
    DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_);
    FAIL() << "DDP accepted models that differ";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the model differs across ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(size_ - 1) + ": parameter 2 is 2.weight float32 [41, 40] here"),
              std::string::npos)
        << what;
  }
}

TEST_F(DdpTest, FindUnusedParametersAveragesZerosForTheHeadARankDidNotUse) {
  // Odd ranks use head_b, even ranks head_a; no rank uses `never`. Small buckets, so that buckets holding used
  // and unused parameters launch at different moments on different ranks.
  DdpOptions options;
  options.find_unused_parameters = true;
  options.first_bucket_cap_mb = 0.0001;  // ~100 bytes: one bucket per layer (a bias joins its weight)
  options.bucket_cap_mb = 0.0002;
  TwoHeads model(7 + 1000 * rank_, device_, stream_);  // made equal by the broadcast
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
  ASSERT_GT(ddp.plan().buckets.size(), 2u);

  // The reference on every rank: the mean over ranks of each rank's gradient, unused heads counting zero.
  TwoHeads reference(7, device_, stream_);
  reference.flatten_parameters(stream_);
  for (int step = 0; step < 2; ++step) {
    const GlobalBatch batch = make_batch(kLocalBatch * size_, step);
    std::vector<double> want;
    for (int r = 0; r < size_; ++r) {
      auto [x, y] = rows(batch, r * kLocalBatch, kLocalBatch);
      reference.zero_grad(stream_);
      reference.use_b = r % 2 == 1;
      autograd::backward(ops::cross_entropy(reference.forward(x, stream_), y, stream_), stream_);
      const auto g = ordered_grads(reference);
      want.resize(g.size(), 0.0);
      for (std::size_t i = 0; i < g.size(); ++i) want[i] += g[i] / static_cast<double>(size_);
    }

    auto [x, y] = rows(batch, rank_ * kLocalBatch, kLocalBatch);
    // Step 1 leaves last step's averaged gradients in place (zero_grad only marks them stale): the unused
    // parameters' stale contents must not reach the all-reduce.
    if (step == 0) {
      model.zero_grad(stream_);
    } else {
      autograd::zero_grad(model.parameters());
    }
    model.use_b = rank_ % 2 == 1;
    ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
    const auto got = ordered_grads(model);
    expect_close(got, std::vector<float>(want.begin(), want.end()), 2e-5);

    // `never` (registered last): exactly zero everywhere.
    const ParameterStore& store = *model.parameter_store();
    for (std::size_t i = store.size() - 2; i < store.size(); ++i) {
      ASSERT_EQ(store.slot(i).name.rfind("never.", 0), 0u) << store.slot(i).name;
      for (float v : store.slot(i).grad.to_vector<float>(stream_)) ASSERT_EQ(v, 0.0f) << store.slot(i).name;
    }
  }
}

TEST_F(DdpTest, AnUnusedParameterIsNamedUnlessFindUnusedParametersIsSet) {
  TwoHeads model(7, device_, stream_);
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_);
  const GlobalBatch batch = make_batch(kLocalBatch * size_, 0);
  auto [x, y] = rows(batch, rank_ * kLocalBatch, kLocalBatch);
  model.zero_grad(stream_);
  try {
    ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
    FAIL() << "DDP accepted parameters without a gradient";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parameter(s) head_b.weight, head_b.bias, never.weight, never.bias got no gradient"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("DdpOptions::find_unused_parameters = true"), std::string::npos) << what;
  }
  // Every rank failed alike and no bucket with an unused parameter was launched; the launched ones complete
  // before the next test.
  group_->barrier();
}

// The main job's CUDA graph: forward, DDP backward with its bucket all-reduces and the AdamW kernel (learning
// rate and bias corrections from device memory) captured once and replayed gives bitwise the parameters of
// eager steps with the same schedule. NCCL only: the MPI backend stages through the host and cannot be captured.
TEST_F(DdpTest, ACapturedStepReplaysTheBitsOfEagerSteps) {
  if (!device_.is_cuda() || group_->backend() != Backend::kNccl) GTEST_SKIP() << "needs CUDA and the NCCL backend";
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap_optimizer" : "ordinary step");
    check_captured_step_replays_eager_steps(overlap);
  }
}

void DdpTest::check_captured_step_replays_eager_steps(bool overlap) {
  DdpOptions options;
  options.first_bucket_cap_mb = 0.001;  // several buckets, so several all-reduces inside the graph
  options.bucket_cap_mb = 0.004;
  options.overlap_optimizer = overlap;
  MLP eager_model(kSizes, Activation::kRelu, 11, device_, stream_);
  DistributedDataParallel eager_ddp(eager_model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
  AdamW eager_opt(*eager_model.parameter_store(), AdamWOptions{}, stream_);
  MLP graph_model(kSizes, Activation::kRelu, 11, device_, stream_);
  DistributedDataParallel graph_ddp(graph_model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
  AdamW graph_opt(*graph_model.parameter_store(), AdamWOptions{}, stream_);
  graph_opt.use_device_scalars(stream_);
  const CosineWithWarmup schedule(1e-2, 2, 8);

  Tensor x = Tensor::zeros({kLocalBatch, kSizes.front()}, DType::kFloat32, device_, stream_);
  Tensor y = Tensor::zeros({kLocalBatch}, DType::kInt32, device_, stream_);
  const std::vector<Tensor> graph_params = graph_model.parameters();
  CudaGraph graph;
  Tensor graph_loss;
  for (int step = 0; step < 8; ++step) {
    auto [bx, by] = rows(make_batch(kLocalBatch * size_, step), rank_ * kLocalBatch, kLocalBatch);
    x.copy_from(bx, stream_);  // in place: the graph reads these addresses
    y.copy_from(by, stream_);
    schedule.apply(eager_opt);
    autograd::zero_grad(eager_model.parameters());
    eager_ddp.backward(ops::cross_entropy(eager_model.forward(x, stream_), y, stream_));
    eager_opt.step(stream_);

    schedule.apply(graph_opt);
    graph_opt.prepare_step(stream_);
    if (step < 2) {  // eager steps first, so the capture finds every block it needs in the allocator's cache
      autograd::zero_grad(graph_params);
      graph_ddp.backward(ops::cross_entropy(graph_model.forward(x, stream_), y, stream_));
      graph_opt.apply_step(stream_);
      continue;
    }
    if (!graph.captured()) {
      graph = CudaGraph::capture(stream_, [&] {
        autograd::zero_grad(graph_params);
        graph_loss = ops::cross_entropy(graph_model.forward(x, stream_), y, stream_);
        graph_ddp.backward(graph_loss);
        graph_opt.apply_step(stream_);
      });
      ASSERT_TRUE(graph.captured()) << graph.error();
      EXPECT_FALSE(graph_ddp.last_stats().timed);
    }
    graph.replay(stream_);
  }
  EXPECT_EQ(ordered(graph_model), ordered(eager_model));
  EXPECT_EQ(graph_opt.steps(), eager_opt.steps());
}

// The main job's graph as it runs now: the batch gathered from the resident data set's cursor and the AdamW
// scalars taken from the optimizer's plan, both inside the graph, so nothing is launched between replays; the
// replays give bitwise the parameters of eager steps that gather by position and write their scalars.
TEST_F(DdpTest, AGraphThatGathersAtTheCursorAndTakesPlannedScalarsReplaysEagerSteps) {
  if (!device_.is_cuda() || group_->backend() != Backend::kNccl) GTEST_SKIP() << "needs CUDA and the NCCL backend";
  constexpr int kSteps = 7;
  const GlobalBatch all = make_batch(kLocalBatch * kSteps, 0);
  std::vector<std::int64_t> order(kLocalBatch * kSteps);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>((i * 5) % order.size());
  const data::DatasetView view{all.x.data(), all.y.data(), static_cast<std::int64_t>(all.y.size()), kSizes.front()};
  data::ResidentDataset eager_data(view, device_, stream_), graph_data(view, device_, stream_);
  eager_data.set_order(order, stream_);
  graph_data.set_order(order, stream_);
  MLP eager_model(kSizes, Activation::kRelu, 13, device_, stream_), graph_model(kSizes, Activation::kRelu, 13, device_, stream_);
  DistributedDataParallel eager_ddp(eager_model.flatten_parameters(stream_), *group_, test_world(), stream_);
  DistributedDataParallel graph_ddp(graph_model.flatten_parameters(stream_), *group_, test_world(), stream_);
  AdamW eager_opt(*eager_model.parameter_store(), AdamWOptions{}, stream_);
  AdamW graph_opt(*graph_model.parameter_store(), AdamWOptions{}, stream_);
  eager_opt.use_device_scalars(stream_);
  const CosineWithWarmup schedule(1e-2, 2, kSteps);
  graph_opt.plan_steps(schedule, kSteps, stream_);
  Tensor x = Tensor::empty({kLocalBatch, kSizes.front()}, DType::kFloat32, device_, stream_);
  Tensor y = Tensor::empty({kLocalBatch}, DType::kInt32, device_, stream_);
  Tensor ex = Tensor::empty({kLocalBatch, kSizes.front()}, DType::kFloat32, device_, stream_);
  Tensor ey = Tensor::empty({kLocalBatch}, DType::kInt32, device_, stream_);
  const std::vector<Tensor> graph_params = graph_model.parameters();
  auto graph_step = [&] {
    graph_data.gather_next(x, y, stream_);
    autograd::zero_grad(graph_params);
    graph_ddp.backward(ops::cross_entropy(graph_model.forward(x, stream_), y, stream_));
    graph_opt.apply_step(stream_);
  };
  CudaGraph graph;
  for (int step = 0; step < kSteps; ++step) {
    eager_data.gather(step * kLocalBatch, ex, ey, stream_);
    schedule.apply(eager_opt);
    autograd::zero_grad(eager_model.parameters());
    eager_ddp.backward(ops::cross_entropy(eager_model.forward(ex, stream_), ey, stream_));
    eager_opt.step(stream_);

    schedule.apply(graph_opt);
    graph_opt.prepare_step(stream_);
    if (step < 2) {
      graph_step();
      continue;
    }
    if (!graph.captured()) {
      graph = CudaGraph::capture(stream_, graph_step);
      ASSERT_TRUE(graph.captured()) << graph.error();
    }
    graph.replay(stream_);
  }
  EXPECT_EQ(graph_data.cursor(), kSteps * kLocalBatch);
  EXPECT_EQ(ordered(graph_model), ordered(eager_model));
  EXPECT_THROW(graph.replay(stream_), InvalidArgument);  // the cursor would pass the end of the order
}

TEST_F(DdpTest, StatsAndBucketsAreReported) {
  MLP model(kSizes, Activation::kRelu, 3, device_, stream_);
  DdpOptions options;
  options.first_bucket_cap_mb = 0.001;  // force several buckets on this small model
  options.bucket_cap_mb = 0.004;
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
  EXPECT_GT(ddp.plan().buckets.size(), 2u);
  const GlobalBatch batch = make_batch(kLocalBatch * size_, 0);
  auto [x, y] = rows(batch, rank_ * kLocalBatch, kLocalBatch);
  ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
  const ReducerStats& stats = ddp.last_stats();
  EXPECT_EQ(stats.buckets, static_cast<int>(ddp.plan().buckets.size()));
  EXPECT_EQ(stats.bucket_timings.size(), ddp.plan().buckets.size());
  for (const auto& t : stats.bucket_timings) EXPECT_GE(t.duration_ms, 0.0);
}

// The runtime's promise of no device allocation in steady state, for the backend this job runs (NCCL, or MPI
// staging through pinned memory, or the CUDA-aware seam) with and without the bf16 compression hook: after
// warm-up steps, further steps call neither cudaMalloc nor cudaHostAlloc. Steps read the loss only at the end.
TEST_F(DdpTest, SteadyStateStepsAllocateNoDeviceOrPinnedMemory) {
  if (!device_.is_cuda()) GTEST_SKIP() << "the CPU allocator is not a cache (malloc is cheap): a GPU property";
  for (GradientCompression compression : {GradientCompression::kNone, GradientCompression::kBFloat16}) {
    DdpOptions options;
    options.first_bucket_cap_mb = 0.001;  // several buckets
    options.bucket_cap_mb = 0.004;
    options.compression = compression;
    MLP model(kSizes, Activation::kRelu, 5, device_, stream_);
    DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, options);
    AdamW optimizer(*model.parameter_store(), AdamWOptions{}, stream_);
    auto [x, y] = rows(make_batch(kLocalBatch * size_, 0), rank_ * kLocalBatch, kLocalBatch);
    auto step = [&] {
      model.zero_grad(stream_);
      Tensor loss = ops::cross_entropy(model.forward(x, stream_), y, stream_);
      ddp.backward(loss);
      optimizer.step(stream_);
      return loss;
    };
    for (int i = 0; i < 3; ++i) step();
    stream_.synchronize();
    const MemoryStats device_before = cuda_allocator(device_.index).stats();
    const MemoryStats pinned_before = pinned_allocator().stats();
    Tensor loss;
    for (int i = 0; i < 5; ++i) loss = step();
    EXPECT_TRUE(std::isfinite(loss.to_vector<float>(stream_)[0]));
    const char* what = compression == GradientCompression::kNone ? "plain" : "bf16 compression";
    EXPECT_EQ(cuda_allocator(device_.index).stats().num_backend_allocs, device_before.num_backend_allocs)
        << what << ", backend " << backend_name(group_->backend()) << ": cudaMalloc in steady state";
    EXPECT_EQ(pinned_allocator().stats().num_backend_allocs, pinned_before.num_backend_allocs)
        << what << ", backend " << backend_name(group_->backend()) << ": cudaHostAlloc in steady state";
  }
}

}  // namespace
}  // namespace ddp
