// BatchLoader: batches match the sampler, buffers come from the caller's allocator, the ring is bounded,
// exceptions reach the consumer, and shutdown mid-epoch is clean.
#include "runtime/data/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "runtime/core/check.h"
#include "tests/data/toy_dataset.h"

namespace ddp {
namespace data {
namespace {

using testing::toy;

SamplerOptions sampler_opts(int64_t n, int replicas = 1, int rank = 0) {
  SamplerOptions o;
  o.dataset_size = n;
  o.num_replicas = replicas;
  o.rank = rank;
  o.seed = 9;
  return o;
}

LoaderOptions loader_opts(int64_t batch) {
  LoaderOptions o;
  o.batch_size = batch;
  return o;
}

TEST(BatchLoader, BatchesFollowTheSampler) {
  const Dataset d = toy(103);
  DistributedSampler reference(sampler_opts(103, 2, 1));
  BatchLoader loader(view(d), reference, loader_opts(10));
  EXPECT_EQ(loader.batches_per_epoch(), 6);  // 52 samples per rank
  for (int64_t epoch : {0, 1}) {
    reference.set_epoch(epoch);
    loader.start_epoch(epoch);
    std::vector<int64_t> expected;
    int64_t count = 0;
    while (const Batch* b = loader.next()) {
      ASSERT_TRUE(reference.next_batch(10, &expected));
      ASSERT_EQ(b->size, static_cast<int64_t>(expected.size()));
      EXPECT_EQ(*b->sample_indices, expected);
      EXPECT_EQ(b->index, count);
      EXPECT_EQ(b->epoch, epoch);
      EXPECT_EQ(b->global_position_after, reference.global_position());
      for (int64_t k = 0; k < b->size; ++k) {
        EXPECT_EQ(b->features[2 * k], static_cast<float>(expected[k]));
        EXPECT_EQ(b->features[2 * k + 1], static_cast<float>(expected[k]) + 0.5f);
        EXPECT_EQ(b->labels[k], expected[k] % 10);
      }
      ++count;
    }
    EXPECT_EQ(count, 6);
    EXPECT_EQ(loader.next(), nullptr);  // stays at the end
  }
}

TEST(BatchLoader, ResumesFromAGlobalPosition) {
  const Dataset d = toy(100);
  BatchLoader loader(view(d), DistributedSampler(sampler_opts(100, 2, 0)), loader_opts(10));
  loader.start_epoch(2);
  std::vector<std::vector<int64_t>> all;
  int64_t position_after_two = 0;
  while (const Batch* b = loader.next()) {
    all.push_back(*b->sample_indices);
    if (all.size() == 2) position_after_two = b->global_position_after;
  }
  EXPECT_EQ(position_after_two, 40);
  loader.start_epoch(2, position_after_two);
  size_t i = 2;
  while (const Batch* b = loader.next()) EXPECT_EQ(*b->sample_indices, all.at(i++));
  EXPECT_EQ(i, all.size());
}

TEST(BatchLoader, UsesTheCallersAllocatorAndFreesEverything) {
  std::atomic<int> live{0};
  LoaderOptions o = loader_opts(8);
  o.buffers = 3;
  o.allocator.allocate = [&](size_t bytes) {
    ++live;
    return ::operator new(bytes);
  };
  o.allocator.deallocate = [&](void* p, size_t) {
    --live;
    ::operator delete(p);
  };
  const Dataset d = toy(64);
  {
    BatchLoader loader(view(d), DistributedSampler(sampler_opts(64)), o);
    EXPECT_EQ(live.load(), 6);  // features + labels for each of 3 buffers
    loader.start_epoch(0);
    EXPECT_NE(loader.next(), nullptr);
  }
  EXPECT_EQ(live.load(), 0);
}

TEST(BatchLoader, PrefetchIsBoundedByTheBuffers) {
  std::atomic<int> filled{0};
  LoaderOptions o = loader_opts(4);
  o.on_filled = [&](Batch&) { ++filled; };
  const Dataset d = toy(400);
  BatchLoader loader(view(d), DistributedSampler(sampler_opts(400)), o);
  loader.start_epoch(0);
  const Batch* first = loader.next();
  ASSERT_NE(first, nullptr);
  // The prefetcher fills the free buffer (however slow a loaded machine is), then must stop: one buffer is held
  // by the consumer, so at most one more batch may be prepared.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (filled.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(filled.load(), 2) << "the prefetcher did not fill the free buffer within 30 s";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(filled.load(), 2) << "the prefetcher filled a buffer the consumer still holds";
}

TEST(BatchLoader, ManualReleaseKeepsABatchWhileTheNextIsHandedOut) {
  LoaderOptions o = loader_opts(5);
  o.manual_release = true;
  const Dataset d = toy(50);
  BatchLoader loader(view(d), DistributedSampler(sampler_opts(50)), o);
  loader.start_epoch(0);
  const Batch* a = loader.next();
  const std::vector<int64_t> a_rows = *a->sample_indices;
  const Batch* b = loader.next();  // the other buffer; `a` is untouched
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(*a->sample_indices, a_rows);
  EXPECT_EQ(a->features[0], static_cast<float>(a_rows[0]));
  loader.release(a);
  const Batch* c = loader.next();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c, a);  // the released buffer came back around
  loader.release(b);
  loader.release(c);
  int rest = 0;
  while (const Batch* x = loader.next()) {
    ++rest;
    loader.release(x);
  }
  EXPECT_EQ(rest, 7);
}

TEST(BatchLoader, PropagatesExceptionsAfterEarlierBatches) {
  LoaderOptions o = loader_opts(10);
  o.on_filled = [](Batch& b) {
    if (b.index == 2) throw std::runtime_error("decode failed on batch 2");
  };
  const Dataset d = toy(100);
  BatchLoader loader(view(d), DistributedSampler(sampler_opts(100)), o);
  loader.start_epoch(0);
  EXPECT_NE(loader.next(), nullptr);
  EXPECT_NE(loader.next(), nullptr);
  try {
    loader.next();
    FAIL() << "expected the prefetch thread's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "decode failed on batch 2");
  }
  // A new epoch starts cleanly after the failure.
  loader.start_epoch(1);
  EXPECT_NE(loader.next(), nullptr);
}

TEST(BatchLoader, StopsCleanlyMidEpoch) {
  const Dataset d = toy(1000);
  for (int i = 0; i < 20; ++i) {
    BatchLoader loader(view(d), DistributedSampler(sampler_opts(1000)), loader_opts(7));
    loader.start_epoch(i);
    if (i % 2) loader.next();
    // Destruction with the prefetch thread blocked on a full ring must join promptly.
  }
  SUCCEED();
}

TEST(BatchLoader, RefusesABatchLargerThanTheShard) {
  const Dataset d = toy(100);
  try {
    BatchLoader loader(view(d), DistributedSampler(sampler_opts(100, 4, 3)), loader_opts(26));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 26 is larger than rank 3's shard of 25 samples"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(BatchLoader(view(d), DistributedSampler(sampler_opts(100)), loader_opts(0)), InvalidArgument);
  EXPECT_THROW(BatchLoader(view(d), DistributedSampler(sampler_opts(99)), loader_opts(4)), InvalidArgument);
}

TEST(BatchLoader, DropLastBatch) {
  LoaderOptions o = loader_opts(30);
  o.drop_last_batch = true;
  const Dataset d = toy(100);
  BatchLoader loader(view(d), DistributedSampler(sampler_opts(100)), o);
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  loader.start_epoch(0);
  int n = 0;
  while (const Batch* b = loader.next()) {
    EXPECT_EQ(b->size, 30);
    ++n;
  }
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace data
}  // namespace ddp
