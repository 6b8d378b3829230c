// DistributedSampler: PyTorch's layout, determinism, and the property DDP relies on: R ranks with batch b see
// per step exactly the samples one rank sees with batch R*b.
#include "runtime/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "runtime/core/check.h"

namespace ddp {
namespace data {
namespace {

SamplerOptions opts(int64_t n, int replicas, int rank, bool drop_last = false) {
  SamplerOptions o;
  o.dataset_size = n;
  o.num_replicas = replicas;
  o.rank = rank;
  o.seed = 42;
  o.drop_last = drop_last;
  return o;
}

TEST(Permutation, IsAPermutationAndDeterministic) {
  const auto p = epoch_permutation(1000, 7, 3);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(p, epoch_permutation(1000, 7, 3));
  EXPECT_NE(p, epoch_permutation(1000, 7, 4));
  EXPECT_NE(p, epoch_permutation(1000, 8, 3));
  EXPECT_EQ(epoch_permutation(5, 7, 3, /*shuffle=*/false), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Permutation, FixedByThisImplementation) {
  // Pinned values: a change to the generator would silently change every run's data order and break resume of
  // older checkpoints, so it must show up here.
  EXPECT_EQ(epoch_permutation(10, 1234, 5), (std::vector<int64_t>{4, 7, 9, 3, 1, 2, 0, 5, 8, 6}));
  EXPECT_EQ(epoch_permutation(8, 0, 0), (std::vector<int64_t>{7, 4, 0, 1, 5, 2, 3, 6}));
}

TEST(DistributedSampler, PadsLikePyTorch) {
  // N=10, R=4: total 12, the permutation's first two entries repeated; rank r takes r, r+4, r+8.
  const auto perm = epoch_permutation(10, 42, 0);
  std::vector<int64_t> padded = perm;
  padded.push_back(perm[0]);
  padded.push_back(perm[1]);
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(opts(10, 4, r));
    EXPECT_EQ(s.total_size(), 12);
    EXPECT_EQ(s.num_samples(), 3);
    EXPECT_EQ(s.indices(), (std::vector<int64_t>{padded[r], padded[r + 4], padded[r + 8]}));
  }
}

TEST(DistributedSampler, PadsMoreThanOnceOverForTinyDataSets) {
  DistributedSampler s(opts(2, 5, 4));
  const auto perm = epoch_permutation(2, 42, 0);
  EXPECT_EQ(s.total_size(), 5);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{perm[0]}));  // position 4 = perm[4 % 2]
}

TEST(DistributedSampler, DropLastCuts) {
  DistributedSampler s(opts(10, 4, 1, /*drop_last=*/true));
  const auto perm = epoch_permutation(10, 42, 0);
  EXPECT_EQ(s.total_size(), 8);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{perm[1], perm[5]}));
}

TEST(DistributedSampler, UnevenForEvaluationCoversEachSampleOnce) {
  std::multiset<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    SamplerOptions o = opts(10, 3, r);
    o.even = false;
    o.shuffle = false;
    DistributedSampler s(o);
    EXPECT_EQ(s.num_samples(), r == 0 ? 4 : 3);
    seen.insert(s.indices().begin(), s.indices().end());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u);
}

// The core property: step s of R ranks with batch b == step s of one rank with batch R*b, as sets.
TEST(DistributedSampler, RanksTimesBatchEqualsOneRankWithBigBatch) {
  for (const int ranks : {2, 3, 4}) {
    for (const int64_t n : {int64_t{1000}, int64_t{997}}) {
      const int64_t b = 16;
      for (int64_t epoch : {0, 1, 5}) {
        DistributedSampler single(opts(n, 1, 0));
        single.set_epoch(epoch);
        std::vector<DistributedSampler> shards;
        for (int r = 0; r < ranks; ++r) {
          shards.emplace_back(opts(n, ranks, r));
          shards.back().set_epoch(epoch);
        }
        std::vector<int64_t> big, small;
        int64_t steps = 0;
        while (single.next_batch(ranks * b, &big)) {
          std::multiset<int64_t> union_of_ranks;
          bool all = true;
          for (auto& s : shards) {
            all = s.next_batch(b, &small) && all;
            union_of_ranks.insert(small.begin(), small.end());
          }
          ASSERT_TRUE(all);
          if (static_cast<int64_t>(big.size()) == ranks * b) {
            EXPECT_EQ(union_of_ranks, std::multiset<int64_t>(big.begin(), big.end()))
                << "ranks=" << ranks << " n=" << n << " epoch=" << epoch << " step=" << steps;
          } else {
            // The last step: the ranks see the single rank's remainder plus the padding (repeats of the head).
            for (int64_t i : big) EXPECT_GE(union_of_ranks.count(i), 1u);
            EXPECT_EQ(union_of_ranks.size(), big.size() + static_cast<size_t>(shards[0].total_size() - n));
          }
          ++steps;
        }
        EXPECT_EQ(steps, (n + ranks * b - 1) / (ranks * b));
      }
    }
  }
}

TEST(DistributedSampler, ResumeAtGlobalPosition) {
  // Two ranks, 3 steps of batch 8 consumed: global position 48. Resuming with 2 or 4 ranks continues exactly.
  const int64_t n = 200;
  std::set<int64_t> first_part, rest_2, rest_4;
  for (int r = 0; r < 2; ++r) {
    DistributedSampler s(opts(n, 2, r, true));
    s.set_epoch(3);
    std::vector<int64_t> batch;
    for (int step = 0; step < 3; ++step) {
      s.next_batch(8, &batch);
      first_part.insert(batch.begin(), batch.end());
    }
    EXPECT_EQ(s.global_position(), 48);
    DistributedSampler resumed(opts(n, 2, r, true));
    resumed.set_epoch(3);
    resumed.set_global_position(48);
    std::vector<int64_t> a, b;
    s.next_batch(8, &a);
    resumed.next_batch(8, &b);
    EXPECT_EQ(a, b);
  }
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(opts(n, 4, r, true));
    s.set_epoch(3);
    s.set_global_position(48);
    std::vector<int64_t> batch;
    while (s.next_batch(8, &batch)) rest_4.insert(batch.begin(), batch.end());
  }
  // Nothing of the first part is seen again, and together they are the whole (distinct) epoch.
  for (int64_t i : first_part) EXPECT_EQ(rest_4.count(i), 0u);
  EXPECT_EQ(first_part.size() + rest_4.size(), 200u);
  DistributedSampler three(opts(n, 3, 0));
  EXPECT_THROW(three.set_global_position(49), InvalidArgument);
  try {
    three.set_global_position(50);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("global sample position 50 with 3 ranks"), std::string::npos);
  }
}

TEST(DistributedSampler, RefusesBadOptions) {
  EXPECT_THROW(DistributedSampler(opts(0, 1, 0)), InvalidArgument);
  EXPECT_THROW(DistributedSampler(opts(10, 0, 0)), InvalidArgument);
  EXPECT_THROW(DistributedSampler(opts(10, 2, 2)), InvalidArgument);
  EXPECT_THROW(DistributedSampler(opts(3, 4, 0, true)), InvalidArgument);
  DistributedSampler s(opts(10, 1, 0));
  std::vector<int64_t> batch;
  EXPECT_THROW(s.next_batch(0, &batch), InvalidArgument);
  EXPECT_THROW(s.set_local_position(11), InvalidArgument);
}

}  // namespace
}  // namespace data
}  // namespace ddp
