// The caching allocator's policy, driven through a fake backend so it runs without a GPU: size classes, reuse
// on the same stream at once, cross-stream reuse only after the freeing stream's event completes,
// record_stream, statistics, empty_cache, the out-of-memory retry, and blocks freed while a stream is being
// captured into a CUDA graph. Plus the CPU allocator's alignment.
#include "runtime/core/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "runtime/core/check.h"

namespace ddp {
namespace {

// Events complete only when the test says so; raw memory comes from new[] with an optional capacity.
struct FakeState {
  std::map<void*, bool> events;  // event -> recorded work done
  std::map<void*, StreamHandle> recorded_on;
  int mallocs = 0, frees = 0;
  std::size_t capacity = SIZE_MAX, used = 0;
  std::map<void*, std::size_t> sizes;
  StreamHandle capturing = nullptr;  // the stream being captured, if any
  int queries_while_capturing = 0, records_while_capturing = 0;
  void complete(StreamHandle s) {
    for (auto& [e, done] : events)
      if (recorded_on[e] == s) done = true;
  }
};

class FakeBackend : public MemoryBackend {
 public:
  explicit FakeBackend(FakeState* s) : s_(s) {}
  std::string name() const override { return "fake"; }
  void* raw_allocate(std::size_t bytes) override {
    if (s_->used + bytes > s_->capacity) return nullptr;
    void* p = new char[bytes];
    s_->sizes[p] = bytes;
    s_->used += bytes;
    ++s_->mallocs;
    return p;
  }
  void raw_free(void* p) override {
    s_->used -= s_->sizes[p];
    s_->sizes.erase(p);
    delete[] static_cast<char*>(p);
    ++s_->frees;
  }
  void* create_event() override {
    void* e = new int(0);
    s_->events[e] = true;
    return e;
  }
  void destroy_event(void* e) override {
    s_->events.erase(e);
    delete static_cast<int*>(e);
  }
  void record_event(void* e, StreamHandle s) override {
    if (s_->capturing != nullptr) ++s_->records_while_capturing;
    s_->events[e] = false;
    s_->recorded_on[e] = s;
  }
  bool event_done(void* e) override {
    if (s_->capturing != nullptr) ++s_->queries_while_capturing;
    return s_->events[e];
  }
  bool capturing(StreamHandle s) override { return s != nullptr && s == s_->capturing; }
  void synchronize_event(void* e) override { s_->events[e] = true; }

 private:
  FakeState* s_;
};

StreamHandle stream(std::uintptr_t id) { return reinterpret_cast<StreamHandle>(id); }

TEST(CachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1 << 20), std::size_t{1} << 20);
  // Above 1 MiB: four classes per power of two.
  EXPECT_EQ(CachingAllocator::round_size((1 << 20) + 1), std::size_t{5} << 18);
  EXPECT_EQ(CachingAllocator::round_size(3 << 20), std::size_t{3} << 20);
  for (std::size_t b : {std::size_t{1}, std::size_t{700}, std::size_t{3} << 20, std::size_t{100000007}}) {
    const std::size_t r = CachingAllocator::round_size(b);
    EXPECT_GE(r, b);
    EXPECT_LE(r, b + b / 4 + 512);
  }
  // Above 8 MiB classes are 2 MiB apart: a 4096x4096x3 MLP's flat parameter buffer (201.4 MB) costs at most
  // 2 MiB more, not the 32 MiB of four classes per power of two.
  const std::size_t flat = std::size_t{50343936} * 4;
  EXPECT_EQ(CachingAllocator::round_size(flat), std::size_t{194} << 20);
  EXPECT_EQ(CachingAllocator::round_size((std::size_t{8} << 20) + 1), std::size_t{10} << 20);
}

TEST(CachingAllocator, ReusesASlightlyLargerCachedBlock) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  void* p = a.allocate(std::size_t{100} << 20, stream(1));
  a.free(p);
  // 96 MiB: within 25% below the cached 100 MiB block, which is handed out (and counted at its own size).
  void* q = a.allocate(std::size_t{96} << 20, stream(1));
  EXPECT_EQ(p, q);
  EXPECT_EQ(a.stats().bytes_in_use, std::int64_t{100} << 20);
  a.free(q);
  // 64 MiB: the cached block is far larger; a new one is made rather than wasting 36 MiB.
  void* r = a.allocate(std::size_t{64} << 20, stream(1));
  EXPECT_NE(p, r);
  EXPECT_EQ(st.mallocs, 2);
  a.free(r);
}

TEST(CachingAllocator, SameStreamReuseIsImmediate) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  void* p = a.allocate(1000, stream(1));
  a.free(p);  // the event on stream 1 is still pending
  void* q = a.allocate(900, stream(1));  // same size class, same stream: reused without waiting
  EXPECT_EQ(p, q);
  EXPECT_EQ(st.mallocs, 1);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.num_allocations, 2);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_backend_allocs, 1);
  EXPECT_EQ(s.bytes_in_use, 1024);
  a.free(q);
}

TEST(CachingAllocator, CrossStreamReuseWaitsForEvent) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  void* p = a.allocate(4096, stream(1));
  a.free(p);
  void* q = a.allocate(4096, stream(2));  // stream 1's work not done: must not reuse p
  EXPECT_NE(p, q);
  EXPECT_EQ(st.mallocs, 2);
  a.free(q);
  st.complete(stream(1));
  void* r = a.allocate(4096, stream(3));  // p's event completed: reusable anywhere
  EXPECT_EQ(r, p);
  EXPECT_EQ(st.mallocs, 2);
  a.free(r);
}

// A capture may neither query nor record an event; a block freed during it keeps the graph's address, so it is
// reused only on the captured stream and never handed back to the backend.
TEST(CachingAllocator, ABlockFreedDuringACaptureBelongsToTheGraphsStream) {
  FakeState s;
  CachingAllocator a(std::make_unique<FakeBackend>(&s));
  void* other = a.allocate(1000, stream(2));
  a.free(other);  // pending on stream 2: a query would be needed to reuse it elsewhere
  s.capturing = stream(1);
  void* t = a.allocate(1000, stream(1));
  EXPECT_NE(t, other);  // not taken from another stream during the capture
  a.free(t);
  void* again = a.allocate(1000, stream(1));
  EXPECT_EQ(again, t);  // the captured stream's own block, in order within the graph
  a.free(again);
  EXPECT_EQ(s.queries_while_capturing, 0);
  EXPECT_EQ(s.records_while_capturing, 0);
  s.capturing = nullptr;
  s.complete(stream(2));
  void* elsewhere = a.allocate(1000, stream(3));
  EXPECT_EQ(elsewhere, other);  // stream 2's block, its work done; the graph's block never on another stream
  a.free(elsewhere);
  EXPECT_EQ(a.allocate(1000, stream(1)), t);  // its own stream, eagerly between replays, may
  a.free(t);
  s.complete(stream(3));
  const int frees = s.frees;
  a.empty_cache();
  EXPECT_EQ(s.frees, frees + 1);  // the ordinary block, not the graph's
}

TEST(CachingAllocator, RecordStreamDelaysEvenSameStreamReuse) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  void* p = a.allocate(2048, stream(1));
  a.record_stream(p, stream(2));  // e.g. the communication stream reads it
  a.free(p);
  void* q = a.allocate(2048, stream(1));
  EXPECT_NE(p, q) << "stream 2 may still be using the block";
  st.complete(stream(2));
  void* r = a.allocate(2048, stream(1));
  EXPECT_EQ(r, p);
  a.free(q);
  a.free(r);
}

TEST(CachingAllocator, HostVisibleMemoryAlwaysWaits) {
  FakeState st;
  CachingAllocatorOptions options;
  options.reuse_on_same_stream_without_event = false;  // the pinned allocator's setting
  CachingAllocator a(std::make_unique<FakeBackend>(&st), options);
  void* p = a.allocate(100, stream(1));
  a.free(p);
  void* q = a.allocate(100, stream(1));
  EXPECT_NE(p, q);
  st.complete(stream(1));
  void* r = a.allocate(100, stream(1));
  EXPECT_EQ(r, p);
  a.free(q);
  a.free(r);
}

TEST(CachingAllocator, StatisticsAndEmptyCache) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  std::vector<void*> ptrs;
  for (int i = 0; i < 4; ++i) ptrs.push_back(a.allocate(10000, stream(1)));
  MemoryStats s = a.stats();
  const std::int64_t block = static_cast<std::int64_t>(CachingAllocator::round_size(10000));
  EXPECT_EQ(s.bytes_in_use, 4 * block);
  EXPECT_EQ(s.peak_bytes_in_use, 4 * block);
  EXPECT_EQ(s.bytes_reserved, 4 * block);
  for (void* p : ptrs) a.free(p);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.peak_bytes_in_use, 4 * block);
  EXPECT_EQ(s.bytes_reserved, 4 * block);  // cached, not returned
  a.empty_cache();  // events pending: nothing can go back yet
  EXPECT_EQ(a.stats().bytes_reserved, 4 * block);
  st.complete(stream(1));
  a.empty_cache();
  s = a.stats();
  EXPECT_EQ(s.bytes_reserved, 0);
  EXPECT_EQ(s.num_backend_frees, 4);
  EXPECT_EQ(st.frees, 4);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().peak_bytes_in_use, 0);
}

TEST(CachingAllocator, SteadyStateLoopDoesNotCallTheBackend) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  for (int step = 0; step < 50; ++step) {
    void* x = a.allocate(1 << 16, stream(1));
    void* y = a.allocate(3 << 20, stream(1));
    void* z = a.allocate(100, stream(1));
    a.free(y);
    a.free(x);
    a.free(z);
  }
  EXPECT_EQ(st.mallocs, 3);
  EXPECT_EQ(a.stats().num_cache_hits, 147);
}

TEST(CachingAllocator, OutOfMemoryFreesCacheAndRetries) {
  FakeState st;
  st.capacity = 8192;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  void* p = a.allocate(8192, stream(1));
  a.free(p);
  void* q = a.allocate(4096, stream(2));  // needs the cached 8 KiB returned first
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(st.frees, 1);
  a.free(q);
  st.complete(stream(2));
  void* big = nullptr;
  EXPECT_NO_THROW(big = a.allocate(8192, stream(1)));
  a.free(big);
  st.complete(stream(1));
  EXPECT_THROW(a.allocate(1 << 20, stream(1)), Error);
}

TEST(CachingAllocator, FreeOfForeignPointerIsAnError) {
  FakeState st;
  CachingAllocator a(std::make_unique<FakeBackend>(&st));
  int x = 0;
  EXPECT_THROW(a.free(&x), Error);
  EXPECT_EQ(a.allocate(0, stream(1)), nullptr);
}

TEST(CpuAllocator, AlignedAndCounted) {
  CpuAllocator a;
  void* p = a.allocate(100);
  void* q = a.allocate(1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % CpuAllocator::kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % CpuAllocator::kAlignment, 0u);
  EXPECT_EQ(a.stats().bytes_in_use, 101);
  a.free(p, 100);
  EXPECT_EQ(a.stats().bytes_in_use, 1);
  EXPECT_EQ(a.stats().peak_bytes_in_use, 101);
  a.free(q, 1);
}

TEST(CpuAllocator, ReusesAFreedBlockOfTheSameSize) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizer build caches nothing (reused memory would hide a use after free)";
#endif
  CpuAllocator a;
  void* p = a.allocate(4096);
  a.free(p, 4096);
  void* q = a.allocate(4096);
  EXPECT_EQ(q, p);
  void* r = a.allocate(100);  // another size: a new block
  EXPECT_NE(r, p);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.num_allocations, 3);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(s.num_backend_allocs, 2);
  EXPECT_EQ(s.bytes_in_use, 4196);
  EXPECT_EQ(s.bytes_reserved, 4196);
  a.free(q, 4096);
  a.free(r, 100);
  EXPECT_EQ(a.stats().bytes_in_use, 0);
  EXPECT_EQ(a.stats().bytes_reserved, 4196);  // kept for the next step
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_reserved, 0);
  EXPECT_EQ(a.stats().num_backend_frees, 2);
  // A block above the size limit goes straight back.
  void* big = a.allocate(CpuAllocator::kMaxCachedBlock + 64);
  a.free(big, CpuAllocator::kMaxCachedBlock + 64);
  EXPECT_EQ(a.stats().bytes_reserved, 0);
}

TEST(PinnedAllocator, WorksWithoutAGpu) {
  // Without a GPU it falls back to host memory; with one it is page-locked. Either way it is usable.
  CachingAllocator& pinned = pinned_allocator();
  auto* p = static_cast<char*>(pinned.allocate(1000, nullptr));
  ASSERT_NE(p, nullptr);
  p[0] = 1;
  p[999] = 2;
  pinned.free(p);
}

}  // namespace
}  // namespace ddp
