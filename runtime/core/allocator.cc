// The caching allocator's policy and its three backends (CUDA device memory, pinned host memory, and the
// aligned-host fallback used when no GPU is there).
#include "runtime/core/allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "runtime/core/check.h"
#include "runtime/core/device.h"

namespace ddp {
void MemoryStats::count_backend_allocation(std::size_t bytes) {
  ++num_backend_allocs;
  bytes_reserved += static_cast<std::int64_t>(bytes);
  peak_bytes_reserved = std::max(peak_bytes_reserved, bytes_reserved);
  count_use(static_cast<std::int64_t>(bytes));
}

void MemoryStats::count_backend_free(std::size_t bytes) {
  ++num_backend_frees;
  bytes_reserved -= static_cast<std::int64_t>(bytes);
}

void MemoryStats::count_use(std::int64_t bytes) {
  bytes_in_use += bytes;
  peak_bytes_in_use = std::max(peak_bytes_in_use, bytes_in_use);
}

void MemoryStats::reset_peaks() {
  peak_bytes_in_use = bytes_in_use;
  peak_bytes_reserved = bytes_reserved;
}

namespace {

constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
// Above 8 MiB the classes are 2 MiB apart: a 201 MB parameter buffer then wastes at most 2 MiB instead of
// up to a quarter of itself (the class 25% above it), which was most of the bf16 benchmark's excess over
// PyTorch's peak memory.
constexpr std::size_t kLargeStep = std::size_t{2} << 20;


// Stream-ordered reuse through CUDA events, shared by the device and the pinned backends. Events are created
// and recorded with `event_device` current (the CPU for pinned memory: no device switch).
class CudaEventBackend : public MemoryBackend {
 public:
  explicit CudaEventBackend(const Device& event_device) : event_device_(event_device) {}
  void* create_event() override {
    CudaDeviceGuard guard(event_device_);
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(void* event) override { DDP_CUDA_WARN(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }
  void record_event(void* event, StreamHandle stream) override {
    CudaDeviceGuard guard(event_device_);
    DDP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream));
  }
  bool event_done(void* event) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) return false;
    DDP_CUDA_CHECK(status);
    return true;
  }
  void synchronize_event(void* event) override {
    DDP_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  bool capturing(StreamHandle stream) override {
    if (stream == nullptr) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    DDP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }

 private:
  Device event_device_;
};

class CudaDeviceBackend : public CudaEventBackend {
 public:
  explicit CudaDeviceBackend(int device) : CudaEventBackend(Device::cuda(device)), device_(device) {}
  std::string name() const override { return "cuda:" + std::to_string(device_); }
  void* raw_allocate(std::size_t bytes) override {
    CudaDeviceGuard guard(Device::cuda(device_));
    void* ptr = nullptr;
    // A capture (thread-local mode) forbids this thread's cudaMalloc; relaxed mode allows it, and a block
    // obtained during a capture is kept for the graph (see free()), so the capture may grow the cache.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    DDP_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    DDP_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so the retry starts clean
      return nullptr;
    }
    DDP_CUDA_CHECK(status);
    return ptr;
  }
  void raw_free(void* ptr) override {
    CudaDeviceGuard guard(Device::cuda(device_));
    DDP_CUDA_WARN(cudaFree(ptr));
  }

 private:
  int device_;
};

class PinnedHostBackend : public CudaEventBackend {
 public:
  PinnedHostBackend() : CudaEventBackend(Device::cpu()) {}
  std::string name() const override { return "pinned"; }
  void* raw_allocate(std::size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    DDP_CUDA_CHECK(status);
    return ptr;
  }
  void raw_free(void* ptr) override { DDP_CUDA_WARN(cudaFreeHost(ptr)); }
};

// No GPU: host memory, and every "stream" is the calling thread, so work is complete when free() is called.
class AlignedHostBackend : public MemoryBackend {
 public:
  std::string name() const override { return "host (no GPU: pinned fallback)"; }
  void* raw_allocate(std::size_t bytes) override {
    return ::operator new(bytes, std::align_val_t{256}, std::nothrow);
  }
  void raw_free(void* ptr) override { ::operator delete(ptr, std::align_val_t{256}); }
  void* create_event() override { return this; }  // any non-null marker
  void destroy_event(void*) override {}
  void record_event(void*, StreamHandle) override {}
  bool event_done(void*) override { return true; }
  void synchronize_event(void*) override {}
  bool capturing(StreamHandle) override { return false; }
};

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<MemoryBackend> backend, CachingAllocatorOptions options)
    : backend_(std::move(backend)), options_(options) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Blocks still in use belong to tensors that outlive the allocator (static destruction order): leave them.
  // The cached ones all go, a graph's too: no graph replays on memory whose allocator is gone.
  for (auto& [size, list] : free_) {
    for (Block& b : list) b.graph_owned = false;
  }
  release_cached_locked(/*wait_for_pending=*/true);
  for (void* e : event_pool_) backend_->destroy_event(e);
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes <= kSmallLimit) return std::max(kSmallStep, (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  std::size_t power = kSmallLimit;
  while (power * 2 < bytes) power *= 2;  // power < bytes <= 2·power
  const std::size_t step = std::min(power / 4, kLargeStep);
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::acquire_event() {
  if (!event_pool_.empty()) {
    void* e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  return backend_->create_event();
}

void CachingAllocator::release_events(Block& block) {
  if (block.own_event != nullptr) event_pool_.push_back(block.own_event);
  for (void* e : block.extra_events) event_pool_.push_back(e);
  block.own_event = nullptr;
  block.extra_events.clear();
}

bool CachingAllocator::reusable_on(Block& block, StreamHandle stream, bool capturing) {
  const bool same = block.stream == stream && options_.reuse_on_same_stream_without_event;
  if (block.graph_owned) return same;
  // While capturing, an event may not be queried: only what needs no query is reusable.
  if (capturing) return same && block.extra_events.empty();
  for (void* e : block.extra_events)
    if (!backend_->event_done(e)) return false;
  if (!same && block.own_event != nullptr && !backend_->event_done(block.own_event)) return false;
  return true;
}

void* CachingAllocator::allocate(std::size_t bytes, StreamHandle stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.num_allocations;
  const bool capturing = backend_->capturing(stream);
  // The smallest cached block of this class or of a larger one up to 25% above the request (the slack the
  // classes themselves allow below 8 MiB), so a slightly smaller request reuses a block instead of a new one.
  const std::size_t largest = size + size / 4;
  for (auto it = free_.lower_bound(size); it != free_.end() && it->first <= largest; ++it) {
    std::vector<Block>& list = it->second;
    // Prefer a block from this stream (no wait at all), then any whose pending work has completed.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = list.size(); i-- > 0;) {
        Block& b = list[i];
        if (pass == 0 && b.stream != stream) continue;
        if (!reusable_on(b, stream, capturing)) continue;
        Block block = std::move(b);
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
        release_events(block);
        if (!block.graph_owned) block.stream = stream;
        block.extra_streams.clear();
        void* ptr = block.ptr;
        in_use_.emplace(ptr, std::move(block));
        ++stats_.num_cache_hits;
        stats_.count_use(static_cast<std::int64_t>(in_use_.at(ptr).size));
        return ptr;
      }
    }
  }
  void* ptr = backend_->raw_allocate(size);
  if (ptr == nullptr && !capturing) {
    // Out of memory: give back every cached block (waiting for their pending work) and try once more.
    release_cached_locked(/*wait_for_pending=*/true);
    ptr = backend_->raw_allocate(size);
  }
  if (ptr == nullptr) {
    throw OutOfMemory(backend_->name() + ": out of memory allocating " + std::to_string(bytes) + " bytes (" +
                std::to_string(stats_.bytes_in_use) + " bytes in use, " + std::to_string(stats_.bytes_reserved) +
                " reserved); reduce the batch size or the model");
  }
  stats_.count_backend_allocation(size);
  Block block;
  block.ptr = ptr;
  block.size = size;
  block.stream = stream;
  in_use_.emplace(ptr, std::move(block));
  return ptr;
}

void CachingAllocator::record_stream(void* ptr, StreamHandle stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_use_.find(ptr);
  DDP_ASSERT(it != in_use_.end(), backend_->name() + ": record_stream on a pointer this allocator does not own");
  Block& b = it->second;
  if (stream == b.stream) return;
  if (std::find(b.extra_streams.begin(), b.extra_streams.end(), stream) == b.extra_streams.end())
    b.extra_streams.push_back(stream);
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_use_.find(ptr);
  DDP_ASSERT(it != in_use_.end(), backend_->name() + ": free of a pointer this allocator does not own");
  Block block = std::move(it->second);
  in_use_.erase(it);
  stats_.count_use(-static_cast<std::int64_t>(block.size));
  if (block.graph_owned || backend_->capturing(block.stream)) {
    block.graph_owned = true;
    block.extra_streams.clear();
    free_[block.size].push_back(std::move(block));
    return;
  }
  block.own_event = acquire_event();
  backend_->record_event(block.own_event, block.stream);
  for (StreamHandle s : block.extra_streams) {
    void* e = acquire_event();
    backend_->record_event(e, s);
    block.extra_events.push_back(e);
  }
  free_[block.size].push_back(std::move(block));
}

void CachingAllocator::release_cached_locked(bool wait_for_pending) {
  for (auto& [size, list] : free_) {
    for (std::size_t i = list.size(); i-- > 0;) {
      Block& b = list[i];
      if (b.graph_owned) continue;  // a graph may still replay its address
      bool done = true;
      if (b.own_event != nullptr) done = done && backend_->event_done(b.own_event);
      for (void* e : b.extra_events) done = done && backend_->event_done(e);
      if (!done && !wait_for_pending) continue;
      if (!done) {
        if (b.own_event != nullptr) backend_->synchronize_event(b.own_event);
        for (void* e : b.extra_events) backend_->synchronize_event(e);
      }
      release_events(b);
      backend_->raw_free(b.ptr);
      stats_.count_backend_free(b.size);
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (auto it = free_.begin(); it != free_.end();) it = it->second.empty() ? free_.erase(it) : std::next(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked(/*wait_for_pending=*/false);
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peaks();
}

CachingAllocator& cuda_allocator(int device) {
  const int count = cuda_device_count();
  DDP_CHECK(device >= 0 && device < count, "cuda_allocator: device " + std::to_string(device) +
                                               " does not exist (" + std::to_string(count) + " visible; " +
                                               cuda_availability().reason + ")");
  // Leaked on purpose: tensors in static objects may free into it during static destruction.
  static std::vector<CachingAllocator*>* allocators = [count] {
    auto* v = new std::vector<CachingAllocator*>(static_cast<std::size_t>(count), nullptr);
    return v;
  }();
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  CachingAllocator*& a = (*allocators)[static_cast<std::size_t>(device)];
  if (a == nullptr) a = new CachingAllocator(std::make_unique<CudaDeviceBackend>(device));
  return *a;
}

bool pinned_memory_available() { return cuda_device_count() > 0; }

CachingAllocator& pinned_allocator() {
  static CachingAllocator* allocator = [] {
    CachingAllocatorOptions options;
    options.reuse_on_same_stream_without_event = false;
    std::unique_ptr<MemoryBackend> backend;
    if (pinned_memory_available()) {
      backend = std::make_unique<PinnedHostBackend>();
    } else {
      backend = std::make_unique<AlignedHostBackend>();
    }
    return new CachingAllocator(std::move(backend), options);
  }();
  return *allocator;
}

namespace {
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCpuCache = false;
#else
constexpr bool kCpuCache = true;
#endif
}  // namespace

CpuAllocator::~CpuAllocator() { empty_cache(); }

void* CpuAllocator::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_allocations;
    const auto cached = cached_.find(bytes);
    if (cached != cached_.end() && !cached->second.empty()) {
      void* ptr = cached->second.back();
      cached->second.pop_back();
      cached_bytes_ -= bytes;
      ++stats_.num_cache_hits;
      stats_.count_use(static_cast<std::int64_t>(bytes));
      return ptr;
    }
  }
  void* ptr = ::operator new(bytes, std::align_val_t{kAlignment}, std::nothrow);
  if (ptr == nullptr) {
    empty_cache();
    ptr = ::operator new(bytes, std::align_val_t{kAlignment}, std::nothrow);
  }
  if (ptr == nullptr) {
    throw OutOfMemory("cpu: out of memory allocating " + std::to_string(bytes) +
                      " bytes: ask for less (a smaller batch, buffer or model)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.count_backend_allocation(bytes);
  return ptr;
}

void CpuAllocator::free(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.count_use(-static_cast<std::int64_t>(bytes));
    if (kCpuCache && bytes <= kMaxCachedBlock && cached_bytes_ + bytes <= kMaxCached) {
      cached_[bytes].push_back(ptr);
      cached_bytes_ += bytes;
      return;
    }
    stats_.count_backend_free(bytes);
  }
  ::operator delete(ptr, std::align_val_t{kAlignment});
}

void CpuAllocator::empty_cache() {
  std::unordered_map<std::size_t, std::vector<void*>> cached;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cached.swap(cached_);
    cached_bytes_ = 0;
    for (const auto& [bytes, blocks] : cached) {
      for (std::size_t i = 0; i < blocks.size(); ++i) stats_.count_backend_free(bytes);
    }
  }
  for (const auto& [bytes, blocks] : cached) {
    for (void* ptr : blocks) ::operator delete(ptr, std::align_val_t{kAlignment});
  }
}

MemoryStats CpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peaks();
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator* allocator = new CpuAllocator();
  return *allocator;
}

MemoryStats memory_stats(const Device& device) {
  return device.is_cuda() ? cuda_allocator(device.index).stats() : cpu_allocator().stats();
}

void reset_peak_memory_stats(const Device& device) {
  if (device.is_cuda()) {
    cuda_allocator(device.index).reset_peak_stats();
  } else {
    cpu_allocator().reset_peak_stats();
  }
}

}  // namespace ddp
