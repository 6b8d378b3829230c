// The reducer on a synthetic backward (gradients written layer by layer, in reverse, with compute between
// them) on the world's device: buckets follow PyTorch DDP's plan and are identical on every rank, gradients
// come out averaged, all-reduces start while backward is still running, no_sync leaves gradients local, and a
// parameter that never gets a gradient, or a model that differs across ranks, is a clear error on every rank.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/distributed/bf16_compression_hook.h"
#include "runtime/distributed/reducer.h"
#include "runtime/distributed/same_parameters.h"
#include "runtime/distributed/world_mpi.h"
#include "tests/distributed/rank_fixture.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;

// The parameters of nn.Sequential(Linear(784,1024), ReLU, Linear(1024,1024), ReLU, Linear(1024,10)).
std::vector<ParameterSpec> mlp_parameters() {
  return {{"0.weight", {1024, 784}}, {"0.bias", {1024}}, {"2.weight", {1024, 1024}},
          {"2.bias", {1024}},        {"4.weight", {10, 1024}}, {"4.bias", {10}}};
}

TEST(BucketPlan, FollowsReverseOrderAndClosesABucketOnceItReachesItsCap) {
  const BucketPlan plan = plan_buckets(mlp_parameters());
  // 4.bias, 4.weight, 2.bias (44 KB) are under the first bucket's 1 MB; 2.weight (4 MB) takes it past, and it
  // closes. The second bucket holds the rest (3.1 MB, under 25 MB).
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].parameters, (std::vector<std::size_t>{5, 4, 3, 2}));
  EXPECT_EQ(plan.buckets[1].parameters, (std::vector<std::size_t>{1, 0}));
  // Offsets are multiples of 16 elements: 4.bias (10) is padded to 16.
  EXPECT_EQ(plan.offsets[5], 0);
  EXPECT_EQ(plan.offsets[4], 16);
  EXPECT_EQ(plan.offsets[3], 16 + 10240);
  EXPECT_EQ(plan.offsets[2], 16 + 10240 + 1024);
  EXPECT_EQ(plan.buckets[0].count, 16 + 10240 + 1024 + 1024 * 1024);
  EXPECT_EQ(plan.buckets[1].offset, plan.buckets[0].count);
  EXPECT_EQ(plan.total, 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 10 * 1024 + 16);
  for (std::int64_t offset : plan.offsets) EXPECT_EQ(offset % 16, 0);
  EXPECT_EQ(plan.layout_order(), (std::vector<std::size_t>{5, 4, 3, 2, 1, 0}));
}

TEST(BucketPlan, ABiasTravelsWithItsWeightInsteadOfInABucketOfItsOwn) {
  BucketOptions options;
  options.bucket_cap_mb = 2.0;
  options.first_bucket_cap_mb = 1.0 / 1024;  // 1 KB
  const BucketPlan plan = plan_buckets(mlp_parameters(), options);
  // [4.bias 4.weight] passes 1 KB; [2.bias 2.weight] passes 2 MB by its weight (4 MB, over the cap on its own);
  // [0.bias 0.weight] likewise (3 MB).
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].parameters, (std::vector<std::size_t>{5, 4}));
  EXPECT_EQ(plan.buckets[1].parameters, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(plan.buckets[2].parameters, (std::vector<std::size_t>{1, 0}));
  for (std::size_t b = 1; b < plan.buckets.size(); ++b) {
    EXPECT_EQ(plan.buckets[b].offset, plan.buckets[b - 1].offset + plan.buckets[b - 1].count);
  }
  EXPECT_THROW(plan_buckets(mlp_parameters(), BucketOptions{0.0, 1.0}), InvalidArgument);
}

TEST(BucketPlan, IsIdenticalOnEveryRank) {
  const BucketPlan plan = plan_buckets(mlp_parameters());
  std::vector<long long> mine;
  for (const auto& b : plan.buckets) {
    mine.push_back(b.offset);
    mine.push_back(b.count);
    for (std::size_t p : b.parameters) mine.push_back(static_cast<long long>(p));
  }
  std::vector<long long> root = mine;
  ASSERT_EQ(MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_LONG_LONG, 0, mpi_comm(test_world())),
            MPI_SUCCESS);
  EXPECT_EQ(mine, root);
}

// Gradient value of element i of parameter k on `rank`.
float grad_value(int rank, std::size_t k, std::int64_t i) {
  return static_cast<float>((i * 7 + static_cast<std::int64_t>(k) * 13) % 101) * 0.5f + static_cast<float>(rank);
}

class ReducerTest : public ddp::testing::RankTest {
 protected:
  void SetUp() override {
    RankTest::SetUp();
    specs_ = mlp_parameters();
    plan_ = plan_buckets(specs_);
    host_.assign(plan_.total, 0.0f);
    if (device_.is_cuda()) {
      DDP_CUDA_CHECK(cudaMalloc(&device_grads_, plan_.total * sizeof(float)));
    }
  }
  void TearDown() override {
    if (device_grads_ != nullptr) cudaFree(device_grads_);
  }
  float* grads() { return device_.is_cuda() ? device_grads_ : host_.data(); }
  CommBuffer buffer() { return CommBuffer{grads(), plan_.total, DType::kFloat32, device_}; }

  // Writes parameter k's gradient (as backward would, on the compute stream) after `work_ms` of compute.
  void produce(std::size_t k, double work_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(work_ms);
    while (std::chrono::steady_clock::now() < until) {
    }
    const std::int64_t n = specs_[k].numel();
    const int rank = group_->rank();
    for (std::int64_t i = 0; i < n; ++i) host_[plan_.offsets[k] + i] = grad_value(rank, k, i);
    if (device_.is_cuda()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(device_grads_ + plan_.offsets[k], host_.data() + plan_.offsets[k],
                                     n * sizeof(float), cudaMemcpyHostToDevice, stream_.handle()));
      stream_.synchronize();  // the host copy is rewritten by the next produce
    }
  }
  std::vector<float> result() {
    if (!device_.is_cuda()) return host_;
    std::vector<float> out(plan_.total);
    DDP_CUDA_CHECK(cudaMemcpyAsync(out.data(), device_grads_, plan_.total * sizeof(float), cudaMemcpyDeviceToHost,
                                   stream_.handle()));
    stream_.synchronize();
    return out;
  }
  void run_backward(Reducer& reducer, const std::vector<std::size_t>& order, double work_ms) {
    reducer.prepare_for_backward();
    for (std::size_t k : order) {
      produce(k, work_ms);
      reducer.mark_ready(k);
    }
    reducer.finalize();
  }
  void expect_averaged(const std::vector<float>& got) {
    const int size = group_->size();
    for (std::size_t k = 0; k < specs_.size(); ++k) {
      const std::int64_t n = specs_[k].numel();
      for (std::int64_t i = 0; i < n; i += 97) {
        const float expected = grad_value(0, k, i) + (size - 1) / 2.0f;
        ASSERT_NEAR(got[plan_.offsets[k] + i], expected, 1e-5f * std::abs(expected)) << specs_[k].name << " " << i;
      }
    }
  }

  std::vector<ParameterSpec> specs_;
  BucketPlan plan_;
  std::vector<float> host_;
  float* device_grads_ = nullptr;
};

TEST_F(ReducerTest, AveragesGradientsAcrossRanks) {
  Reducer reducer(*group_, plan_, buffer(), stream_);
  run_backward(reducer, {5, 4, 3, 2, 1, 0}, 0.0);
  expect_averaged(result());
  EXPECT_EQ(reducer.last_stats().buckets, 2);
}

TEST_F(ReducerTest, AllReducesStartWhileBackwardIsStillRunning) {
  Reducer reducer(*group_, plan_, buffer(), stream_);
  // kWork ms of "compute" before each gradient: the first bucket is complete after the fourth, 4 kWork into a
  // backward of 6 kWork; its all-reduce must start within kWork of that (slack for a loaded, oversubscribed machine).
  constexpr double kWork = 40.0;
  run_backward(reducer, {5, 4, 3, 2, 1, 0}, kWork);
  const ReducerStats& stats = reducer.last_stats();
  ASSERT_EQ(stats.issue_us.size(), 2u);
  EXPECT_LT(stats.issue_us[0], stats.backward_end_us - kWork * 1000.0)
      << "the first bucket's all-reduce was issued " << stats.issue_us[0] << " us into a backward of "
      << stats.backward_end_us << " us: no overlap";
  EXPECT_GT(stats.backward_ms, 5 * kWork);
  EXPECT_GE(stats.allreduce_ms, 0.0);
  EXPECT_GE(stats.exposed_comm_ms, 0.0);
  ASSERT_EQ(stats.bucket_timings.size(), 2u);
  // The first bucket's all-reduce really ran (not only was issued) before backward ended.
  EXPECT_GE(stats.bucket_timings[0].start_ms, 0.0);
  EXPECT_LT(stats.bucket_timings[0].start_ms, stats.backward_end_us / 1000.0 - kWork);
  EXPECT_EQ(stats.bucket_timings[0].bytes, (16u + 10240u + 1024u + 1024u * 1024u) * 4u);
  expect_averaged(result());
}

TEST_F(ReducerTest, BucketsLaunchInOrderWhateverOrderGradientsArriveIn) {
  Reducer reducer(*group_, plan_, buffer(), stream_);
  // Rank-dependent arrival order: buckets must still be issued 0, 1 on every rank, or the sums would mix.
  std::vector<std::size_t> order = {2, 1, 0, 5, 4, 3};
  if (group_->rank() % 2 == 1) order = {3, 0, 4, 1, 5, 2};
  run_backward(reducer, order, 0.0);
  expect_averaged(result());
}

TEST_F(ReducerTest, NoSyncKeepsGradientsLocal) {
  Reducer reducer(*group_, plan_, buffer(), stream_);
  reducer.set_sync(false);
  run_backward(reducer, {5, 4, 3, 2, 1, 0}, 0.0);
  const std::vector<float> got = result();
  const int rank = group_->rank();
  for (std::size_t k = 0; k < specs_.size(); ++k) {
    ASSERT_EQ(got[plan_.offsets[k] + 3], grad_value(rank, k, 3)) << specs_[k].name;
  }
  reducer.set_sync(true);
  run_backward(reducer, {5, 4, 3, 2, 1, 0}, 0.0);
  expect_averaged(result());
}

TEST_F(ReducerTest, ParameterWithoutGradientIsNamed) {
  Reducer reducer(*group_, plan_, buffer(), stream_);
  reducer.prepare_for_backward();
  for (std::size_t k : {5, 4, 3, 2, 1}) {
    produce(k, 0.0);
    reducer.mark_ready(k);
  }
  try {
    reducer.finalize();
    FAIL() << "finalize accepted a missing gradient";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0 got no gradient"), std::string::npos) << e.what();
  }
  // The launched first bucket must still complete on every rank before the next test.
  group_->barrier();
}

TEST_F(ReducerTest, BFloat16CompressionAveragesWithinBFloat16Precision) {
  BFloat16CompressionHook hook(buffer(), stream_);
  ReducerOptions options;
  options.hook = &hook;
  Reducer reducer(*group_, plan_, buffer(), stream_, options);
  run_backward(reducer, {5, 4, 3, 2, 1, 0}, 0.0);
  const std::vector<float> got = result();
  const int size = group_->size();
  for (std::size_t k = 0; k < specs_.size(); ++k) {
    for (std::int64_t i = 0; i < specs_[k].numel(); i += 101) {
      const float expected = grad_value(0, k, i) + (size - 1) / 2.0f;
      // Each rank's value and the sum are rounded to bfloat16 (8-bit mantissa): about 2^-8 relative, twice.
      ASSERT_NEAR(got[plan_.offsets[k] + i], expected, 2.0f * std::ldexp(std::abs(expected), -8) + 1e-6f)
          << specs_[k].name << " " << i;
    }
  }
}

TEST(ParameterCheck, IdenticalModelsPass) { EXPECT_NO_THROW(verify_parameters_match(test_world(), mlp_parameters())); }

TEST(ParameterCheck, DifferentModelsEndEveryRankNamingTheParameterAndRanks) {
  World& world = test_world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<ParameterSpec> specs = mlp_parameters();
  if (world.rank() == world.size() - 1) specs[2].shape = {1024, 512};
  const auto start = std::chrono::steady_clock::now();
  try {
    verify_parameters_match(world, specs);
    FAIL() << "mismatched models accepted";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the model differs across ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(world.size() - 1) +
                        ": parameter 2 is 2.weight float32 [1024, 512] here but 2.weight float32 [1024, 1024] on "
                        "rank 0"),
              std::string::npos)
        << what;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(ParameterCheck, DifferentParameterCountsAreNamed) {
  World& world = test_world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<ParameterSpec> specs = mlp_parameters();
  if (world.rank() == 1) specs.pop_back();
  try {
    verify_parameters_match(world, specs);
    FAIL();
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: this rank has 5 parameters, rank 0 has 6 (first missing: 4.bias"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
