// DistributedDataParallel::join with uneven inputs: rank r has 5, 7 or 9 batches (r % 3). Nothing hangs, every
// rank ends with bitwise the same parameters, and those are the ones a double-precision computation of the
// same SGD steps gives, where step s's gradient is the sum of the per-rank gradients of the ranks that still
// had a batch divided by the world size (divide_by_initial_world_size) or by their number. Also: the
// throw_on_early_termination mode raises on every rank at the first step a rank is out of data, and a
// joined_step hook keeps the optimizer state (momentum) of the ranks out of data in step.
//
// Tolerance: the model runs in float32 (forward, softmax, GEMMs, the all-reduce), the reference in double:
// relative 1e-5 of the largest parameter after 9 steps.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ddp.h"
#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/join.h"
#include "runtime/distributed/world_mpi.h"
#include "tests/distributed/rank_fixture.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;

constexpr std::int64_t kIn = 6, kOut = 4, kRows = 5;
constexpr double kLr = 0.5;

int batches_of(int rank) { return 5 + 2 * (rank % 3); }

// Rank r's batch s: features and labels from (r, s) alone, so every rank can compute every rank's batch.
struct Batch {
  std::vector<float> x;  // [kRows, kIn]
  std::vector<std::int32_t> y;
};
Batch batch_of(int rank, int step) {
  Batch b;
  for (std::int64_t i = 0; i < kRows * kIn; ++i) b.x.push_back(std::sin(0.7f * i + 1.9f * step + 3.1f * rank));
  for (std::int64_t i = 0; i < kRows; ++i) b.y.push_back(static_cast<std::int32_t>((i + 2 * step + rank) % kOut));
  return b;
}

// A linear model in double: W [kOut, kIn] row-major then b [kOut], as PyTorch's Linear.
struct Reference {
  std::vector<double> w, b;

  // The gradient of the mean cross-entropy over `batch`, added to (gw, gb) times `weight`.
  void add_gradient(const Batch& batch, double weight, std::vector<double>& gw, std::vector<double>& gb) const {
    for (std::int64_t i = 0; i < kRows; ++i) {
      std::vector<double> z(kOut);
      double top = -1e300;
      for (std::int64_t o = 0; o < kOut; ++o) {
        z[o] = b[o];
        for (std::int64_t k = 0; k < kIn; ++k) z[o] += w[o * kIn + k] * batch.x[i * kIn + k];
        top = std::max(top, z[o]);
      }
      double total = 0;
      for (double& v : z) total += (v = std::exp(v - top));
      for (std::int64_t o = 0; o < kOut; ++o) {
        const double d = (z[o] / total - (batch.y[i] == o ? 1.0 : 0.0)) * weight / kRows;
        gb[o] += d;
        for (std::int64_t k = 0; k < kIn; ++k) gw[o * kIn + k] += d * batch.x[i * kIn + k];
      }
    }
  }

  // Plain SGD over the steps of `ranks` ranks with uneven batch counts.
  void train(int ranks, bool divide_by_initial_world_size, int steps) {
    for (int s = 0; s < steps; ++s) {
      int training = 0;
      for (int r = 0; r < ranks; ++r) training += s < batches_of(r) ? 1 : 0;
      const double weight = 1.0 / (divide_by_initial_world_size ? ranks : training);
      std::vector<double> gw(w.size(), 0.0), gb(b.size(), 0.0);
      for (int r = 0; r < ranks; ++r) {
        if (s < batches_of(r)) add_gradient(batch_of(r, s), weight, gw, gb);
      }
      for (std::size_t k = 0; k < w.size(); ++k) w[k] -= kLr * gw[k];
      for (std::size_t k = 0; k < b.size(); ++k) b[k] -= kLr * gb[k];
    }
  }
};

class JoinTest : public ddp::testing::RankTest {
 protected:
  std::pair<Tensor, Tensor> tensors(const Batch& b) {
    return {Tensor::from_vector(b.x, {kRows, kIn}, device_, stream_),
            Tensor::from_int32(b.y, {kRows}, device_, stream_)};
  }

  // Weight then bias, whatever the flat layout.
  std::vector<float> parameters(Module& m) {
    std::vector<float> out;
    for (auto& [name, t] : m.named_parameters()) {
      const auto v = t.to_vector<float>(stream_);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // True when every rank holds bitwise these values.
  bool same_on_every_rank(const std::vector<float>& values) {
    std::vector<float> low = values, high = values;
    MPI_Allreduce(MPI_IN_PLACE, low.data(), static_cast<int>(low.size()), MPI_FLOAT, MPI_MIN, mpi_comm(test_world()));
    MPI_Allreduce(MPI_IN_PLACE, high.data(), static_cast<int>(high.size()), MPI_FLOAT, MPI_MAX, mpi_comm(test_world()));
    return low == values && high == values;
  }

  static void expect_close(const std::vector<float>& got, const Reference& want, double rel) {
    std::vector<double> all = want.w;
    all.insert(all.end(), want.b.begin(), want.b.end());
    ASSERT_EQ(got.size(), all.size());
    double scale = 0, worst = 0;
    for (double v : all) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - all[i]));
    EXPECT_LE(worst, rel * scale) << "largest difference " << worst << ", scale " << scale;
  }

  std::unique_ptr<Sgd> sgd(MLP& model, double lr, double momentum) {
    SgdOptions o;
    o.lr = lr;
    o.momentum = momentum;
    o.weight_decay = 0;
    return std::make_unique<Sgd>(*model.parameter_store(), o, stream_);
  }

  void step(MLP& model, DistributedDataParallel& ddp, Optimizer& optimizer, const Batch& batch) {
    auto [x, y] = tensors(batch);
    model.zero_grad(stream_);
    ddp.backward(ops::cross_entropy(model.forward(x, stream_), y, stream_));
    optimizer.step(stream_);
  }

  // This rank's batches_of(rank_) steps inside ddp.join; the steps it took before join returned or threw.
  int train_in_join(MLP& model, DistributedDataParallel& ddp, Optimizer& optimizer, const JoinOptions& options,
                    int* taken) {
    *taken = 0;
    ddp.join(
        [&] {
          for (int s = 0; s < batches_of(rank_); ++s) {
            step(model, ddp, optimizer, batch_of(rank_, s));
            ++*taken;
          }
        },
        options);
    return *taken;
  }

  Reference reference_from(Module& m) {
    const std::vector<float> p = parameters(m);
    Reference r;
    r.w.assign(p.begin(), p.begin() + kOut * kIn);
    r.b.assign(p.begin() + kOut * kIn, p.end());
    return r;
  }

  void train_unevenly(bool divide_by_initial_world_size, DdpOptions ddp_options = {}, double tolerance = 1e-5) {
    MLP model({kIn, kOut}, Activation::kRelu, /*seed=*/3 + 100 * rank_, device_, stream_);
    DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, ddp_options);
    const auto optimizer = sgd(model, kLr, 0);
    Reference reference = reference_from(model);  // rank 0's, after the broadcast

    JoinOptions options;
    options.divide_by_initial_world_size = divide_by_initial_world_size;
    int taken = 0;
    EXPECT_EQ(train_in_join(model, ddp, *optimizer, options, &taken), batches_of(rank_));

    int most = 0;
    for (int r = 0; r < size_; ++r) most = std::max(most, batches_of(r));
    reference.train(size_, divide_by_initial_world_size, most);
    const std::vector<float> got = parameters(model);
    EXPECT_TRUE(same_on_every_rank(got)) << "the ranks end with different parameters";
    expect_close(got, reference, tolerance);
  }
};

TEST_F(JoinTest, UnevenBatchesDividedByTheWorldSizeMatchADoublePrecisionWeightedMean) { train_unevenly(true); }

TEST_F(JoinTest, UnevenBatchesDividedByTheRanksTrainingMatchADoublePrecisionMean) { train_unevenly(false); }

// A communication hook averages over the world; the reducer rescales to the ranks training (bf16 rounding).
TEST_F(JoinTest, CompressedGradientsAreAveragedOverTheRanksTraining) {
  DdpOptions o;
  o.compression = GradientCompression::kBFloat16;
  train_unevenly(false, o, 1e-2);
}

TEST_F(JoinTest, ThrowOnEarlyTerminationStopsEveryRankAtTheSameStep) {
  MLP model({kIn, kOut}, Activation::kRelu, 3, device_, stream_);
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_);
  const auto optimizer = sgd(model, kLr, 0);
  Reference reference = reference_from(model);
  JoinOptions options;
  options.throw_on_early_termination = true;
  int taken = 0;
  std::string message;
  try {
    train_in_join(model, ddp, *optimizer, options, &taken);
  } catch (const InputsExhausted& e) {
    message = e.what();
  }
  const int fewest = size_ == 1 ? batches_of(0) : 5;
  EXPECT_EQ(taken, fewest);
  if (size_ > 1) {
    const int out = (size_ + 2) / 3;  // ranks 0, 3, ... have 5 batches
    EXPECT_EQ(message, "inputs exhausted: " + std::to_string(out) + " of " + std::to_string(size_) +
                           " ranks ran out of data before backward 6 (join with throw_on_early_termination): "
                           "every rank stops here");
  } else {
    EXPECT_EQ(message, "");
  }
  reference.train(size_, true, fewest);  // every rank still had a batch at these steps
  const std::vector<float> got = parameters(model);
  EXPECT_TRUE(same_on_every_rank(got));
  expect_close(got, reference, 1e-5);

  // The model goes on training normally afterwards (the tape holds nothing of the step that raised).
  step(model, ddp, *optimizer, batch_of(rank_, 100));
  EXPECT_TRUE(same_on_every_rank(parameters(model)));
}

// SGD with momentum: a rank out of data that runs the optimizer step on each zero-gradient step it takes part
// in keeps the momentum of the others, so the ranks stay identical through later full steps.
TEST_F(JoinTest, AJoinedStepHookKeepsTheOptimizerStateInStep) {
  MLP model({kIn, kOut}, Activation::kRelu, 3, device_, stream_);
  DdpOptions ddp_options;
  ddp_options.first_bucket_cap_mb = 0.00001;  // one bucket per parameter: several all-reduces per step
  DistributedDataParallel ddp(model.flatten_parameters(stream_), *group_, test_world(), stream_, ddp_options);
  ASSERT_EQ(ddp.plan().buckets.size(), 2u);
  const auto optimizer = sgd(model, 0.1, 0.9);
  JoinOptions options;
  options.divide_by_initial_world_size = false;
  options.joined_step = [&] { optimizer->step(stream_); };
  int taken = 0;
  train_in_join(model, ddp, *optimizer, options, &taken);
  int most = 0;
  for (int r = 0; r < size_; ++r) most = std::max(most, batches_of(r));
  EXPECT_EQ(optimizer->steps(), most) << "every rank's optimizer takes every step";
  // Full steps after the join (no broadcast to hide a difference): stale momentum would move a rank apart.
  for (int s = 0; s < 2; ++s) step(model, ddp, *optimizer, batch_of(rank_, 20 + s));
  EXPECT_TRUE(same_on_every_rank(parameters(model))) << "the ranks moved apart after the join";
}

}  // namespace
}  // namespace ddp
