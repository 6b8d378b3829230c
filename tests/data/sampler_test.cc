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

TEST(DistributedSampler, SettingTheEpochLaidOutAlreadyRewindsToTheSameIndices) {
  // train_mlp lays out the next epoch before the device finishes the current one, then sets it again.
  const int64_t n = 200;
  DistributedSampler fresh(opts(n, 2, 1, true));
  fresh.set_epoch(5);
  DistributedSampler early(opts(n, 2, 1, true));
  early.set_epoch(5);
  std::vector<int64_t> a, b;
  early.next_batch(8, &a);  // partly consumed, then set again: back at the start
  early.set_epoch(5);
  early.set_global_position(0);
  EXPECT_EQ(early.global_position(), 0);
  EXPECT_EQ(early.indices(), fresh.indices());
  // A resume point in the epoch is another layout; setting the epoch again lays the whole of it out.
  early.set_global_position(48);
  EXPECT_EQ(early.num_samples(), (n - 48) / 2);
  early.set_epoch(5);
  EXPECT_EQ(early.indices(), fresh.indices());
  early.set_epoch(6);
  EXPECT_NE(early.indices(), fresh.indices());
}

TEST(DistributedSampler, ResumeAtGlobalPosition) {
  // Two ranks, 3 steps of batch 8 consumed: global position 48. Resuming with 2 ranks continues exactly.
  const int64_t n = 200;
  for (int r = 0; r < 2; ++r) {
    DistributedSampler s(opts(n, 2, r, true));
    s.set_epoch(3);
    std::vector<int64_t> batch;
    for (int step = 0; step < 3; ++step) s.next_batch(8, &batch);
    EXPECT_EQ(s.global_position(), 48);
    DistributedSampler resumed(opts(n, 2, r, true));
    resumed.set_epoch(3);
    resumed.set_global_position(48);
    EXPECT_EQ(resumed.global_position(), 48);
    std::vector<int64_t> a, b;
    while (s.next_batch(8, &a)) {
      ASSERT_TRUE(resumed.next_batch(8, &b));
      EXPECT_EQ(a, b);
      EXPECT_EQ(s.global_position(), resumed.global_position());
    }
    EXPECT_FALSE(resumed.next_batch(8, &b));
    EXPECT_TRUE(resumed.epoch_finished());
  }
}

// What R ranks with batch b consume in `steps` steps of `epoch` after starting at global position `from`:
// the samples in order of position, and the global position reached (the same on every rank).
struct Consumed {
  std::vector<std::vector<int64_t>> per_rank;  // each rank's samples, in its order
  int64_t position = 0;
  int64_t batches = 0;  // per rank, all ranks alike
};
Consumed run_ranks(int64_t n, int ranks, int64_t epoch, int64_t from, int64_t b, int64_t steps) {
  Consumed c;
  c.per_rank.resize(static_cast<size_t>(ranks));
  std::vector<int64_t> batches(static_cast<size_t>(ranks), 0);
  std::vector<int64_t> positions;
  for (int r = 0; r < ranks; ++r) {
    DistributedSampler s(opts(n, ranks, r));
    s.set_epoch(epoch);
    s.set_global_position(from);
    std::vector<int64_t> batch;
    for (int64_t k = 0; (steps < 0 || k < steps) && s.next_batch(b, &batch); ++k) {
      c.per_rank[static_cast<size_t>(r)].insert(c.per_rank[static_cast<size_t>(r)].end(), batch.begin(), batch.end());
      ++batches[static_cast<size_t>(r)];
    }
    positions.push_back(s.global_position());
  }
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(positions[static_cast<size_t>(r)], positions[0]) << "ranks disagree on the position";
    EXPECT_EQ(batches[static_cast<size_t>(r)], batches[0]) << "ranks take different numbers of batches";
  }
  c.position = positions[0];
  c.batches = batches[0];
  return c;
}

std::multiset<int64_t> all_of(const Consumed& c) {
  std::multiset<int64_t> all;
  for (const auto& v : c.per_rank) all.insert(v.begin(), v.end());
  return all;
}

// Stopped on N ranks after some steps, resumed on M ranks for the rest of the epoch, N and M in {1, 2, 3, 4}:
// every sample the epoch had not reached is seen exactly once, the only extra ones are the padding (fewer than
// M, from the head of the permutation), and with M = N each rank's rest is exactly its own.
TEST(DistributedSampler, ResumesOnAnyWorldSizeSeeingTheRestOfTheEpochOnce) {
  const int64_t epoch = 2;
  for (const int64_t n : {int64_t{97}, int64_t{100}, int64_t{13}}) {
    const std::vector<int64_t> perm = epoch_permutation(n, 42, epoch);
    for (int saved = 1; saved <= 4; ++saved) {
      for (const int64_t b : {int64_t{3}, int64_t{5}}) {
        for (const int64_t steps : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{4}}) {
          const Consumed before = run_ranks(n, saved, epoch, 0, b, steps);
          const int64_t p = before.position;
          if (p >= n) continue;  // the epoch ended: nothing to resume within it
          ASSERT_EQ(p, saved * b * before.batches);
          // The first part is the permutation's first p positions.
          EXPECT_EQ(all_of(before), std::multiset<int64_t>(perm.begin(), perm.begin() + p));
          const std::multiset<int64_t> unseen(perm.begin() + p, perm.end());
          for (int resumed = 1; resumed <= 4; ++resumed) {
            SCOPED_TRACE("n=" + std::to_string(n) + " N=" + std::to_string(saved) + " M=" + std::to_string(resumed) +
                         " b=" + std::to_string(b) + " position=" + std::to_string(p));
            const Consumed rest = run_ranks(n, resumed, epoch, p, b, -1);
            std::multiset<int64_t> extra = all_of(rest);
            for (int64_t i : unseen) {
              ASSERT_GE(extra.count(i), 1u) << "sample " << i << " not seen after the resume";
              extra.erase(extra.find(i));
            }
            // What is left is the padding; it repeats samples seen before the resume point whenever the point
            // is past it (at 0 it is a whole epoch's padding, as in PyTorch).
            EXPECT_LT(extra.size(), static_cast<size_t>(resumed));
            EXPECT_EQ(extra, std::multiset<int64_t>(perm.begin(), perm.begin() + static_cast<int64_t>(extra.size())));
            EXPECT_EQ(rest.position, p + static_cast<int64_t>(all_of(rest).size()));
            if (resumed == saved) {
              const Consumed whole = run_ranks(n, saved, epoch, 0, b, -1);
              for (int r = 0; r < saved; ++r) {
                const auto& all = whole.per_rank[static_cast<size_t>(r)];
                const auto& first = before.per_rank[static_cast<size_t>(r)];
                EXPECT_EQ(rest.per_rank[static_cast<size_t>(r)],
                          std::vector<int64_t>(all.begin() + static_cast<int64_t>(first.size()), all.end()));
              }
            }
          }
        }
      }
    }
  }
}

// A resumed epoch's positions go on from the resume point, so it can be interrupted and resumed again at yet
// another size: 2 ranks, then 3, then 4 see the epoch's samples once each (plus the last part's padding).
TEST(DistributedSampler, ResumesTwiceAtDifferentSizes) {
  const int64_t n = 101, epoch = 1;
  const std::vector<int64_t> perm = epoch_permutation(n, 42, epoch);
  const Consumed first = run_ranks(n, 2, epoch, 0, 4, 3);       // 24 samples
  const Consumed second = run_ranks(n, 3, epoch, first.position, 5, 2);  // 30 more
  EXPECT_EQ(second.position, 54);
  const Consumed third = run_ranks(n, 4, epoch, second.position, 7, -1);
  EXPECT_EQ(third.position, 102);  // 47 left, padded to 48
  std::multiset<int64_t> all = all_of(first);
  for (int64_t i : all_of(second)) all.insert(i);
  for (int64_t i : all_of(third)) all.insert(i);
  std::multiset<int64_t> expected(perm.begin(), perm.end());
  expected.insert(perm[0]);  // the padding of the last part
  EXPECT_EQ(all, expected);
}

TEST(DistributedSampler, ResumePastTheEndLeavesNothing) {
  DistributedSampler s(opts(10, 4, 3));
  s.set_epoch(0);
  s.set_global_position(12);  // 4 ranks' padded end
  EXPECT_EQ(s.num_samples(), 0);
  EXPECT_TRUE(s.epoch_finished());
  std::vector<int64_t> batch;
  EXPECT_FALSE(s.next_batch(4, &batch));
  EXPECT_EQ(s.batches_per_epoch(4), 0);
  s.check_batch_size(3);  // against a whole epoch's shard, not the rest
  EXPECT_THROW(s.set_global_position(-1), InvalidArgument);
}

TEST(PerReplicaBatchSize, SplitsOrSaysWhatWould) {
  EXPECT_EQ(per_replica_batch_size(256, 4), 64);
  EXPECT_EQ(per_replica_batch_size(255, 3), 85);
  EXPECT_EQ(per_replica_batch_size(7, 1), 7);
  try {
    per_replica_batch_size(256, 3);
    ADD_FAILURE() << "256 over 3 ranks was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "a global batch of 256 does not split evenly over 3 ranks; start 2 or 4 ranks, which "
                           "divide it (a resumed run keeps its global batch), or for a new run pass a multiple of 3 "
                           "(255 or 258) or a per-rank batch size");
  }
  // The case of issue 40: 385, the hint for a new run, is what a resume refuses; 4 or 6 ranks resume.
  try {
    per_replica_batch_size(384, 5);
    ADD_FAILURE() << "384 over 5 ranks was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("start 4 or 6 ranks"), std::string::npos) << e.what();
  }
  try {
    per_replica_batch_size(2, 4);
    ADD_FAILURE() << "2 over 4 ranks was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pass a multiple of 4 (4)"), std::string::npos) << e.what();
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
