// The sharded optimizer (DdpOptions::shard_optimizer, ZeRO stage 1) against the unsharded one, on the same
// ranks from the same seed: after several steps the parameters, the bf16 weight copies and the optimizer state
// are the same bits, for SGD with momentum and AdamW, with gradient clipping and with bf16 master weights. The
// two runs are made and stepped side by side in one process per rank.
//
// Why bitwise: the optimizer's arithmetic per element is the same in both, and so are the averaged gradients
// where the reduction is — every rank's gradient summed, then multiplied by 1/N. Sharded, a bucket is
// reduce-scattered instead of all-reduced, and MPI adds the N per-rank terms in an order of its choosing, which
// differs between MPI_Allreduce and MPI_Reduce_scatter (Open MPI picks different algorithms for them).
// With 1 or 2 ranks there is one order (a + b = b + a): the test fails on any difference. With 3 or 4 ranks each
// averaged gradient element may differ by the rounding of a regrouped sum of N terms, at most (N−1)·2⁻²⁴·Σ|g_r|/N,
// and the test bounds what 6 steps make of that (kReorderedSumBound; observed here: at most 5e-8).
//
// Also: the state each rank keeps is ceil(total/N) elements per buffer, measured by the allocator's counters;
// a checkpoint saved sharded is the unsharded run's file and resumes either way; a failed write on rank 0
// leaves no rank waiting; a world larger than the model, and sharding with gradient compression, end every rank
// with one message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "ddp.h"
#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/allocator.h"
#include "runtime/core/graph.h"
#include "runtime/distributed/bucket_optimizer_shard.h"
#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/world_mpi.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/checkpoint.h"
#include "runtime/models/bf16_weights.h"
#include "runtime/training/training_checkpoint.h"
#include "tests/distributed/rank_fixture.h"
#include "tests/distributed/test_world.h"
#include "tests/scratch.h"

namespace ddp {
namespace {

using ddp::testing::test_world;
using ddp::Activation;

// Layer sizes whose parameter counts share no factor with 3 or 4, in small buckets: several buckets, every one
// of them padded for the shards.
const std::vector<std::int64_t> kSizes = {23, 37, 41, 7};
constexpr std::int64_t kBatch = 6;  // per rank
constexpr int kSteps = 6;

DdpOptions small_buckets(bool shard) {
  DdpOptions o;
  o.bucket_cap_mb = 4096.0 / (1 << 20);  // 1024 floats
  o.first_bucket_cap_mb = 1024.0 / (1 << 20);
  o.shard_optimizer = shard;
  return o;
}

enum class Kind { kSgd, kAdamW };

struct Recipe {
  Kind kind = Kind::kAdamW;
  double clip = 0;  // clip_grad_norm bound, 0: none
  bool bf16 = false;
};

// One training run on this rank: the model, its DDP and optimizer, stepped by step().
class TrainingRun {
 public:
  TrainingRun(const Recipe& recipe, bool shard, ProcessGroup& group, const Stream& stream)
      : recipe_(recipe), stream_(stream), model_(kSizes, Activation::kRelu, /*seed=*/3, stream.device(), stream) {
    ddp_ = std::make_unique<DistributedDataParallel>(model_.flatten_parameters(stream), group, test_world(), stream,
                                                     small_buckets(shard));
    ParameterStore& store = *model_.parameter_store();
    if (recipe.kind == Kind::kSgd) {
      optimizer_ = std::make_unique<Sgd>(store, SgdOptions{0.05, 0.9, 0.0, 1e-3, false}, stream);
    } else {
      optimizer_ = std::make_unique<AdamW>(store, AdamWOptions{5e-3, 0.9, 0.999, 1e-8, 0.05}, stream);
    }
    if (recipe.bf16) {
      weights_ = std::make_unique<Bf16Weights>(store, stream);
      optimizer_->set_bf16_copy(weights_->flat());
    }
  }

  void step(int s) {
    const int rank = test_world().rank();
    std::vector<float> x(static_cast<std::size_t>(kBatch * kSizes.front()));
    std::vector<std::int32_t> y(static_cast<std::size_t>(kBatch));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.31f * i + 1.7f * s + 0.9f * rank) * 1.3f;
    for (std::int64_t r = 0; r < kBatch; ++r) y[r] = static_cast<std::int32_t>((r * 5 + s * 3 + rank) % kSizes.back());
    const Tensor tx = Tensor::from_vector(x, {kBatch, kSizes.front()}, stream_.device(), stream_);
    const Tensor ty = Tensor::from_int32(y, {kBatch}, stream_.device(), stream_);
    model_.zero_grad(stream_);
    const Tensor logits = weights_ ? forward_bf16(model_, *weights_, tx, stream_) : model_.forward(tx, stream_);
    ddp_->backward(ops::cross_entropy(logits, ty, stream_));
    if (recipe_.clip > 0) norms_.push_back(clip_grad_norm(*model_.parameter_store(), recipe_.clip, stream_));
    optimizer_->step(stream_);
  }

  // Per parameter (registration order): its values, its bf16 copy, and each state buffer's values where this
  // rank keeps them (NaN elsewhere).
  std::vector<std::vector<float>> parameters() const {
    std::vector<std::vector<float>> out;
    for (const ParameterSlot& slot : store().slots()) out.push_back(slot.param.to_vector<float>(stream_));
    return out;
  }
  std::vector<std::vector<float>> bf16_copies() const {
    std::vector<std::vector<float>> out;
    for (std::size_t i = 0; i < store().size(); ++i) {
      out.push_back(weights_->copy(i).to_dtype(DType::kFloat32, stream_).to_vector<float>(stream_));
    }
    return out;
  }
  std::vector<std::vector<float>> state(std::size_t buffer) const {
    const std::vector<float> packed = optimizer_->state()[buffer].second.to_vector<float>(stream_);
    std::vector<std::vector<float>> out;
    for (const ParameterSlot& slot : store().slots()) {
      std::vector<float> v(static_cast<std::size_t>(slot.numel), std::nanf(""));
      std::int64_t state_offset = 0;
      for (const FlatSpan& span : optimizer_->state_spans()) {
        for (const FlatSpan& piece : intersect({span}, {slot.offset, slot.numel})) {
          std::copy_n(packed.begin() + state_offset + (piece.offset - span.offset), piece.count,
                      v.begin() + (piece.offset - slot.offset));
        }
        state_offset += span.count;
      }
      out.push_back(std::move(v));
    }
    return out;
  }

  const ParameterStore& store() const { return *model_.parameter_store(); }
  const Optimizer& optimizer() const { return *optimizer_; }
  Optimizer& optimizer() { return *optimizer_; }
  MLP& model() { return model_; }
  DistributedDataParallel& ddp() { return *ddp_; }
  const std::vector<double>& norms() const { return norms_; }

 private:
  Recipe recipe_;
  const Stream& stream_;
  MLP model_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Bf16Weights> weights_;
  std::vector<double> norms_;
};

// A sum of N float terms added in two different orders differs by at most (N−1) roundings of partial sums of
// magnitude ≤ Σ|terms|; over a few steps of training the difference is carried into the parameters (of
// magnitude ~0.1-1 here) and the state. Observed differences are printed; this bound is 20x the largest seen.
constexpr double kReorderedSumBound = 1e-6;

// Largest |a − b| over elements both define (NaN marks "not kept here").
double largest_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].size(), b[t].size());
    for (std::size_t i = 0; i < a[t].size() && i < b[t].size(); ++i) {
      if (std::isnan(a[t][i]) || std::isnan(b[t][i])) continue;
      if (std::memcmp(&a[t][i], &b[t][i], sizeof(float)) == 0) continue;
      worst = std::max(worst, std::abs(static_cast<double>(a[t][i]) - b[t][i]));
      if (std::isnan(worst) || worst == 0) worst = 1e30;  // -0 vs +0 or a NaN in one only: not the same bits
    }
  }
  return worst;
}

class ZeroTest : public ddp::testing::RankTest {
 protected:
  void expect_same(const char* what, double difference) {
    if (test_world().rank() == 0) std::printf("%s: largest difference %g at %d ranks\n", what, difference, size_);
    if (size_ <= 2) {
      EXPECT_EQ(difference, 0.0) << what << " differ at " << size_ << " ranks";
    } else {
      EXPECT_LE(difference, kReorderedSumBound) << what;
    }
  }

  void check(const Recipe& recipe) {
    TrainingRun plain(recipe, /*shard=*/false, *group_, stream_);
    TrainingRun sharded(recipe, /*shard=*/true, *group_, stream_);
    ASSERT_FALSE(plain.optimizer().sharded());
    ASSERT_TRUE(sharded.optimizer().sharded());
    for (int s = 0; s < kSteps; ++s) {
      plain.step(s);
      sharded.step(s);
    }
    expect_same("parameters", largest_difference(sharded.parameters(), plain.parameters()));
    for (std::size_t k = 0; k < plain.optimizer().state().size(); ++k) {
      expect_same(plain.optimizer().state()[k].first.c_str(), largest_difference(sharded.state(k), plain.state(k)));
    }
    if (recipe.bf16) expect_same("bf16 copies", largest_difference(sharded.bf16_copies(), plain.bf16_copies()));
    if (recipe.clip > 0) {
      ASSERT_EQ(sharded.norms().size(), plain.norms().size());
      double worst = 0;
      for (std::size_t s = 0; s < plain.norms().size(); ++s) {
        worst = std::max(worst, std::abs(sharded.norms()[s] - plain.norms()[s]) / plain.norms()[s]);
      }
      if (test_world().rank() == 0) std::printf("gradient norms: largest relative difference %g at %d ranks\n", worst, size_);
      for (std::size_t s = 0; s < plain.norms().size(); ++s) {
        // From the same gradients, the same norm to a double's rounding of a regrouped sum (far below what
        // changes the float coefficient); at 3 and 4 ranks the gradients themselves differ as above.
        const double relative = size_ <= 2 ? 1e-12 : 1e-6;
        EXPECT_NEAR(sharded.norms()[s], plain.norms()[s], relative * plain.norms()[s]) << "step " << s;
        EXPECT_GT(plain.norms()[s], recipe.clip) << "the bound should clip at step " << s;
      }
    }
  }
};

TEST_F(ZeroTest, SgdWithMomentumGivesTheUnshardedParametersAndState) { check({Kind::kSgd, 0, false}); }

TEST_F(ZeroTest, AdamWGivesTheUnshardedParametersAndState) { check({Kind::kAdamW, 0, false}); }

TEST_F(ZeroTest, ClippedAdamWGivesTheUnshardedParametersAndNorms) { check({Kind::kAdamW, 0.05, false}); }

TEST_F(ZeroTest, Bf16MasterWeightsGiveTheUnshardedCopies) { check({Kind::kAdamW, 0, true}); }

TEST_F(ZeroTest, ClippedSgdWithBf16) { check({Kind::kSgd, 0.05, true}); }

// Each rank's state is ceil(total/N) elements per buffer of the padded flat buffer (each bucket padded to a
// multiple of 16·N), measured by the allocator; that is at most 16 elements per bucket above ceil(total/N) of the
// unsharded buffer.
TEST_F(ZeroTest, EachRankKeepsACeilingShareOfTheState) {
  MLP unsharded_model(kSizes, Activation::kRelu, 3, device_, stream_);
  DistributedDataParallel unsharded(unsharded_model.flatten_parameters(stream_), *group_, test_world(), stream_,
                                    small_buckets(false));
  const std::int64_t plain_total = unsharded_model.parameter_store()->total_numel();

  MLP model(kSizes, Activation::kRelu, 3, device_, stream_);
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, small_buckets(true));
  const std::int64_t total = model.parameter_store()->total_numel();
  const std::int64_t share = (total + size_ - 1) / size_;
  EXPECT_EQ(total % size_, 0) << "the padded buffer splits evenly";
  const std::int64_t buckets = static_cast<std::int64_t>(ddp.plan().buckets.size());
  EXPECT_GE(buckets, 3);
  EXPECT_LE(share, (plain_total + size_ - 1) / size_ + 16 * buckets);

  auto in_use = [&] {
    stream_.synchronize();
    return device_.is_cuda() ? cuda_allocator(device_.index).stats().bytes_in_use : cpu_allocator().stats().bytes_in_use;
  };
  auto block = [&](std::int64_t elements) {
    const auto bytes = static_cast<std::size_t>(elements) * sizeof(float);
    return static_cast<std::int64_t>(device_.is_cuda() ? CachingAllocator::round_size(bytes) : bytes);
  };
  const std::int64_t before = in_use();
  AdamW adamw(*model.parameter_store(), AdamWOptions{}, stream_);
  EXPECT_EQ(in_use() - before, 2 * block(share)) << "AdamW: exp_avg and exp_avg_sq of " << share << " elements";
  EXPECT_EQ(adamw.state()[0].second.numel(), share);
  const std::int64_t before_sgd = in_use();
  Sgd sgd(*model.parameter_store(), SgdOptions{0.1, 0.9, 0, 0, false}, stream_);
  EXPECT_EQ(in_use() - before_sgd, block(share)) << "SGD: the momentum buffer of " << share << " elements";
}

// The optimizer's all-gathers are timed like the reducer's buckets: their durations and the part the step still
// waited for (hidden under the updates of the later buckets).
TEST_F(ZeroTest, TheParameterAllGathersAreTimed) {
  TrainingRun run({Kind::kAdamW, 0, false}, true, *group_, stream_);
  EXPECT_FALSE(run.ddp().last_gather_stats().timed);
  run.step(0);
  const GatherStats& stats = run.ddp().last_gather_stats();
  EXPECT_TRUE(stats.timed);
  EXPECT_GE(stats.gather_ms, 0.0);
  EXPECT_GE(stats.exposed_ms, 0.0);
}

// The main job's CUDA graph with the sharded optimizer: forward, backward with its in-place reduce-scatters,
// the AdamW kernel over this rank's slices (scalars from device memory) with each bucket's all-gather, and the
// bf16 refresh of the gathered slices, captured once and replayed, give the bits of eager sharded steps. NCCL
// only (the MPI backend stages through the host and cannot be captured).
TEST_F(ZeroTest, ACapturedShardedStepReplaysTheBitsOfEagerSteps) {
  if (!device_.is_cuda() || group_->backend() != Backend::kNccl) GTEST_SKIP() << "needs CUDA and the NCCL backend";
  auto make = [&](MLP& model) {
    auto ddp = std::make_unique<DistributedDataParallel>(model.flatten_parameters(stream_), *group_, test_world(),
                                                         stream_, small_buckets(true));
    return ddp;
  };
  MLP eager_model(kSizes, Activation::kRelu, 11, device_, stream_);
  auto eager_ddp = make(eager_model);
  AdamW eager_opt(*eager_model.parameter_store(), AdamWOptions{}, stream_);
  Bf16Weights eager_w(*eager_model.parameter_store(), stream_);
  eager_opt.set_bf16_copy(eager_w.flat());
  MLP graph_model(kSizes, Activation::kRelu, 11, device_, stream_);
  auto graph_ddp = make(graph_model);
  AdamW graph_opt(*graph_model.parameter_store(), AdamWOptions{}, stream_);
  Bf16Weights graph_w(*graph_model.parameter_store(), stream_);
  graph_opt.set_bf16_copy(graph_w.flat());
  graph_opt.use_device_scalars(stream_);
  const CosineWithWarmup schedule(1e-2, 2, 8);

  Tensor x = Tensor::zeros({kBatch, kSizes.front()}, DType::kFloat32, device_, stream_);
  Tensor y = Tensor::zeros({kBatch}, DType::kInt32, device_, stream_);
  const std::vector<Tensor> graph_params = graph_model.parameters();
  CudaGraph graph;
  for (int step = 0; step < 8; ++step) {
    std::vector<float> hx(static_cast<std::size_t>(kBatch * kSizes.front()));
    std::vector<std::int32_t> hy(static_cast<std::size_t>(kBatch));
    for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = std::cos(0.7f * i + step + test_world().rank());
    for (std::int64_t r = 0; r < kBatch; ++r) hy[r] = static_cast<std::int32_t>((r + step) % kSizes.back());
    x.copy_from(Tensor::from_vector(hx, x.shape(), device_, stream_), stream_);  // in place: the graph reads x
    y.copy_from(Tensor::from_int32(hy, y.shape(), device_, stream_), stream_);
    schedule.apply(eager_opt);
    autograd::zero_grad(eager_model.parameters());
    eager_ddp->backward(ops::cross_entropy(forward_bf16(eager_model, eager_w, x, stream_), y, stream_));
    eager_opt.step(stream_);

    schedule.apply(graph_opt);
    graph_opt.prepare_step(stream_);
    auto body = [&] {
      autograd::zero_grad(graph_params);
      graph_ddp->backward(ops::cross_entropy(forward_bf16(graph_model, graph_w, x, stream_), y, stream_));
      graph_opt.apply_step(stream_);
    };
    if (step < 2) {  // eager steps first: the capture then finds every block it needs in the allocator's cache
      body();
      continue;
    }
    if (!graph.captured()) {
      graph = CudaGraph::capture(stream_, body);
      ASSERT_TRUE(graph.captured()) << graph.error();
      EXPECT_FALSE(graph_ddp->last_gather_stats().timed);
    }
    graph.replay(stream_);
  }
  std::vector<float> eager_bits, graph_bits;
  for (const Tensor& t : eager_model.parameters()) {
    for (float v : t.to_vector<float>(stream_)) eager_bits.push_back(v);
  }
  for (const Tensor& t : graph_params) {
    for (float v : t.to_vector<float>(stream_)) graph_bits.push_back(v);
  }
  EXPECT_EQ(graph_bits, eager_bits);
  EXPECT_EQ(graph_w.flat().to_dtype(DType::kFloat32, stream_).to_vector<float>(stream_),
            eager_w.flat().to_dtype(DType::kFloat32, stream_).to_vector<float>(stream_));
}

// A directory every rank knows: made by rank 0, its name broadcast.
std::string shared_directory(const char* name) {
  char path[4096] = {};
  if (test_world().rank() == 0) {

    const std::string pattern = ddp::testing::scratch_path(name) + ".XXXXXX";
    std::snprintf(path, sizeof path, "%s", pattern.c_str());
    if (::mkdtemp(path) == nullptr) path[0] = '\0';
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, mpi_comm(test_world()));
  return path;
}

io::CheckpointMetadata metadata_at(int step) {
  io::CheckpointMetadata m;
  m.step = step;
  m.world_size = test_world().size();
  return m;
}

// A checkpoint saved sharded holds the state of the whole model: it is the unsharded run's file where the two
// runs have the same bits (1 and 2 ranks), it loads into a sharded and an unsharded optimizer alike, and a
// sharded run resumed from it takes the steps of the run that saved it, bit for bit.
TEST_F(ZeroTest, ACheckpointSavedShardedResumesShardedAndUnsharded) {
  const std::string dir = shared_directory("zero_ckpt");
  ASSERT_FALSE(dir.empty());
  const Recipe recipe{Kind::kAdamW, 0, false};
  TrainingRun plain(recipe, false, *group_, stream_);
  TrainingRun sharded(recipe, true, *group_, stream_);
  for (int s = 0; s < 3; ++s) {
    plain.step(s);
    sharded.step(s);
  }
  std::string plain_path;
  if (test_world().rank() == 0) {
    plain_path = training::save_training_checkpoint(dir + "/plain", plain.model(), plain.optimizer(), metadata_at(3),
                                                    stream_);
  }
  const std::string path = training::save_training_checkpoint(dir + "/sharded", sharded.model(), sharded.optimizer(),
                                                              metadata_at(3), stream_);
  EXPECT_EQ(path.empty(), test_world().rank() != 0) << "rank 0 writes, and only rank 0";
  if (test_world().rank() == 0 && size_ <= 2) {
    EXPECT_EQ(io::read_file(path), io::read_file(plain_path)) << "the sharded run's file differs from the unsharded";
  }
  MPI_Barrier(mpi_comm(test_world()));  // the file is complete before any rank reads it

  const std::string written = dir + "/sharded/" + io::checkpoint_file_name(3);
  TrainingRun resumed(recipe, true, *group_, stream_);
  TrainingRun resumed_plain(recipe, false, *group_, stream_);
  training::restore_training_checkpoint(written, resumed.model(), resumed.optimizer(), stream_);
  training::restore_training_checkpoint(written, resumed_plain.model(), resumed_plain.optimizer(), stream_);
  EXPECT_EQ(resumed.optimizer().steps(), 3);
  EXPECT_EQ(largest_difference(resumed.parameters(), sharded.parameters()), 0.0);
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(largest_difference(resumed.state(k), sharded.state(k)), 0.0) << "sharded state " << k;
    EXPECT_EQ(largest_difference(resumed_plain.state(k), sharded.state(k)), 0.0) << "unsharded state " << k;
  }
  resumed.step(3);
  sharded.step(3);
  EXPECT_EQ(largest_difference(resumed.parameters(), sharded.parameters()), 0.0) << "the step after the resume";
}

// Rank 0 cannot write (the checkpoint directory is a file): it says why, the other ranks finish their part of
// the gathers instead of waiting for ever, and no file appears.
TEST_F(ZeroTest, AFailedWriteOnRankZeroLeavesNoRankWaiting) {
  const std::string dir = shared_directory("zero_fail");
  ASSERT_FALSE(dir.empty());
  TrainingRun sharded({Kind::kSgd, 0, false}, true, *group_, stream_);
  sharded.step(0);
  const std::string not_a_directory = dir + "/file";
  if (test_world().rank() == 0) io::write_file_atomically(not_a_directory, std::string("x"));
  MPI_Barrier(mpi_comm(test_world()));
  std::string error;
  try {
    training::save_training_checkpoint(not_a_directory, sharded.model(), sharded.optimizer(), metadata_at(1), stream_);
  } catch (const InvalidArgument& e) {
    error = e.what();
  }
  if (test_world().rank() == 0) {
    EXPECT_NE(error.find("exists but is not a directory"), std::string::npos) << error;
  } else {
    EXPECT_EQ(error, "");
  }
  // Every rank is back in step: the next collective completes.
  sharded.step(1);
}

TEST_F(ZeroTest, AWorldLargerThanTheModelIsRefusedOnEveryRank) {
  if (size_ <= 2) GTEST_SKIP() << "needs three ranks: the smallest model has 2 elements";
  MLP tiny({1, 1}, Activation::kNone, 0, device_, stream_);  // weight [1,1] and bias [1]: 2 elements
  ParameterStore& store = tiny.flatten_parameters(stream_);
  try {
    DistributedDataParallel ddp(store, *group_, test_world(), stream_, small_buckets(true));
    FAIL() << "sharded 2 elements over " << size_ << " ranks";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be sharded over " + std::to_string(size_) + " ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ZeroTest, ShardingWithGradientCompressionIsRefusedOnEveryRank) {
  MLP model(kSizes, Activation::kRelu, 3, device_, stream_);
  DdpOptions o = small_buckets(true);
  o.compression = GradientCompression::kBFloat16;
  try {
    DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, o);
    FAIL() << "sharded with compression";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be combined with gradient compression"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
