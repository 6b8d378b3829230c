// Memory for tensors: a caching allocator for CUDA device memory, the same cache over pinned host memory (for
// asynchronous copies), and a plain 64-byte-aligned CPU allocator, each with statistics a user can read.
//
// Why a cache: cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so a training step
// must not call them. Freed blocks go to per-size-class free lists and are handed out again.
//
// Why reuse is ordered by stream: a block freed by the host may still be read or written by kernels already
// queued on its stream. A later allocation on the *same* stream is ordered after that work, so the block is
// reusable there at once. On any other stream it is reusable only once an event recorded on the freeing stream
// (and on every stream named through record_stream) has completed. Pinned host memory is written by the host
// itself (staging copies), so there even same-stream reuse waits for the event.
//
// Why a block freed while its stream is being captured into a CUDA graph is kept apart: the graph replays the
// block's address, so only work ordered with the replays (the same stream) may reuse it, and the cache never
// hands it back to the backend. No event is recorded or queried while a stream captures (either would be
// captured into, or break, the graph); during a capture a block is reused only from its own stream.
//
// The caching logic talks to a MemoryBackend, so the policy is the same code for device memory, pinned memory
// and the fake backend the CPU tests drive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/stream.h"

namespace ddp {

struct MemoryStats {
  std::int64_t bytes_in_use = 0;         // handed out and not freed (rounded to the block size)
  std::int64_t peak_bytes_in_use = 0;
  std::int64_t bytes_reserved = 0;       // obtained from the backend: in use + cached
  std::int64_t peak_bytes_reserved = 0;
  std::int64_t num_allocations = 0;      // allocate() calls
  std::int64_t num_cache_hits = 0;       // allocate() calls served from the cache
  std::int64_t num_backend_allocs = 0;   // cudaMalloc / cudaHostAlloc calls
  std::int64_t num_backend_frees = 0;    // cudaFree / cudaFreeHost calls

  // The bookkeeping every allocator shares.
  void count_backend_allocation(std::size_t bytes);  // obtained from the backend and handed out
  void count_backend_free(std::size_t bytes);        // handed back to the backend
  void count_use(std::int64_t bytes);                // handed out (> 0) or returned (< 0) without the backend
  void reset_peaks();
};

// Where a CachingAllocator gets raw memory and stream-ordered completion markers from.
class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string name() const = 0;
  // nullptr when out of memory (the cache then frees what it holds and retries).
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) = 0;
  virtual void record_event(void* event, StreamHandle stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  // True while `stream` is being captured into a CUDA graph.
  virtual bool capturing(StreamHandle stream) = 0;
};

struct CachingAllocatorOptions {
  // Device memory: true (kernels on one stream run in order). Pinned memory: false (the host writes it).
  bool reuse_on_same_stream_without_event = true;
};

class CachingAllocator {
 public:
  CachingAllocator(std::unique_ptr<MemoryBackend> backend, CachingAllocatorOptions options = {});
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 is allowed and returns nullptr), 256-byte aligned, for use on `stream`.
  void* allocate(std::size_t bytes, StreamHandle stream);
  // Returns `ptr` to the cache: reusable at once on its allocation stream (see the file comment), elsewhere
  // after the work queued so far on that stream and on every record_stream stream completes.
  void free(void* ptr);
  // `ptr` is also used by work on `stream`: its reuse will wait for that work as well.
  void record_stream(void* ptr, StreamHandle stream);
  // Hands every cached block whose pending work has finished back to the backend.
  void empty_cache();

  MemoryStats stats() const;
  void reset_peak_stats();
  const MemoryBackend& backend() const { return *backend_; }

  // Size classes: multiples of 512 B up to 1 MiB, then four classes per power of two (at most 25% slack).
  static std::size_t round_size(std::size_t bytes);

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;
    StreamHandle stream = nullptr;
    std::vector<StreamHandle> extra_streams;
    void* own_event = nullptr;               // recorded on `stream` at free
    std::vector<void*> extra_events;         // recorded on each extra stream at free
    bool graph_owned = false;                // freed while `stream` was captured: see the file comment
  };

  bool reusable_on(Block& block, StreamHandle stream, bool capturing);
  void release_events(Block& block);
  void* acquire_event();
  void release_cached_locked(bool wait_for_pending);

  std::unique_ptr<MemoryBackend> backend_;
  CachingAllocatorOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> in_use_;
  std::map<std::size_t, std::vector<Block>> free_;  // size class -> cached blocks
  std::vector<void*> event_pool_;
  MemoryStats stats_;
};

// The caching allocator for CUDA device `device` (created on first use, lives for the process).
CachingAllocator& cuda_allocator(int device);
// Pinned (page-locked) host memory through cudaHostAlloc, portable across devices. Without a usable GPU it
// falls back to ordinary 64-byte-aligned host memory, so CPU-only code paths still work.
CachingAllocator& pinned_allocator();
// True when pinned_allocator() really hands out page-locked memory.
bool pinned_memory_available();

// Ordinary host memory, 64-byte aligned (one cache line, the widest vector load). A freed block of at most
// kMaxCachedBlock bytes is kept, by its exact size, for the next allocation of that size (at most kMaxCached
// bytes in all): a training step frees and allocates the same sizes every step, and glibc's malloc would give
// the top of its heap back to the system after each one and fault the pages in again at the next. Not in the
// sanitizer build, where reused memory would hide a use after free.
class CpuAllocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kMaxCachedBlock = std::size_t{16} << 20;
  static constexpr std::size_t kMaxCached = std::size_t{256} << 20;
  ~CpuAllocator();
  void* allocate(std::size_t bytes);
  void free(void* ptr, std::size_t bytes);
  // Hands every cached block back to the system.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peak_stats();

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> cached_;  // free blocks by size
  std::size_t cached_bytes_ = 0;
};

CpuAllocator& cpu_allocator();

// The statistics of the allocator behind tensors on `device` (a GPU's caching allocator, or the CPU allocator),
// as torch.cuda.memory_stats: bytes in use and their peak, allocations, and how often the backend was called.
MemoryStats memory_stats(const Device& device);
// Starts the peak figures of `device`'s allocator again from what is in use now.
void reset_peak_memory_stats(const Device& device);

}  // namespace ddp
