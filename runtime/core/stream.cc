#include "runtime/core/stream.h"

#include <cuda_runtime_api.h>

#include <iterator>
#include <utility>
#include <vector>

#include "runtime/core/check.h"

namespace ddp {

Stream Stream::create(const Device& device, int priority) {
  Stream s;
  s.device_ = device;
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device);
    cudaStream_t handle = nullptr;
    DDP_CUDA_CHECK(cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, priority));
    s.stream_ = handle;
  }
  return s;
}

Stream Stream::borrow(const Device& device, StreamHandle handle) {
  Stream s;
  s.device_ = device;
  s.stream_ = handle;
  s.owned_ = false;
  return s;
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)), owned_(other.owned_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr && owned_) DDP_CUDA_WARN(cudaStreamDestroy(stream_));
    device_ = other.device_;
    stream_ = std::exchange(other.stream_, nullptr);
    owned_ = other.owned_;
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr && owned_) DDP_CUDA_WARN(cudaStreamDestroy(stream_));
}

void Stream::synchronize() const {
  if (stream_ != nullptr) DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Stream::record_foreign_event(void* cuda_event) const {
  if (stream_ != nullptr) DDP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(cuda_event), stream_));
}

void CpuCompletion::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = false;
}

void CpuCompletion::signal() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
}

void CpuCompletion::wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return done_; });
}

bool CpuCompletion::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

Event Event::create(const Device& device, bool timing) {
  Event e;
  e.device_ = device;
  if (device.is_cuda()) {
    CudaDeviceGuard guard(device);
    cudaEvent_t handle = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&handle, timing ? cudaEventDefault : cudaEventDisableTiming));
    e.event_ = handle;
  }
  return e;
}

Event::Event(Event&& other) noexcept : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) DDP_CUDA_WARN(cudaEventDestroy(event_));
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) DDP_CUDA_WARN(cudaEventDestroy(event_));
}

void Event::record(const Stream& stream) {
  if (event_ == nullptr) return;  // CPU: the calling thread's work before this point is done
  DDP_CHECK(stream.device() == device_, "Event on " + device_.str() + " recorded on a stream of " +
                                            stream.device().str());
  DDP_CUDA_CHECK(cudaEventRecord(event_, stream.handle()));
}

void Event::wait(const Stream& stream) const {
  if (event_ == nullptr || stream.handle() == nullptr) {
    synchronize();
    return;
  }
  DDP_CUDA_CHECK(cudaStreamWaitEvent(stream.handle(), event_, 0));
}

void Event::synchronize() const {
  if (event_ != nullptr) DDP_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() const {
  if (event_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  DDP_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  DDP_CHECK(event_ != nullptr && start.event_ != nullptr, "elapsed time needs two CUDA events");
  float ms = 0.0f;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

EventPool::EventPool(const Device& device, bool timing)
    : device_(device), timing_(timing), free_(std::make_shared<Free>()) {}

std::shared_ptr<Event> EventPool::acquire() {
  Event event;
  {
    std::lock_guard<std::mutex> lock(free_->mutex);
    if (!free_->events.empty()) {
      event = std::move(free_->events.back());
      free_->events.pop_back();
    }
  }
  if (event.handle() == nullptr) event = Event::create(device_, timing_);
  std::shared_ptr<Free> free = free_;
  return std::shared_ptr<Event>(new Event(std::move(event)), [free](Event* e) {
    {
      std::lock_guard<std::mutex> lock(free->mutex);
      free->events.push_back(std::move(*e));
    }
    delete e;
  });
}

// ---- The current stream ----

namespace {
// This thread's guarded streams, oldest first (StreamGuard).
std::vector<const Stream*>& guarded_streams() {
  thread_local std::vector<const Stream*> streams;
  return streams;
}
}  // namespace

const Stream& cpu_stream() {
  static const Stream* stream = new Stream();
  return *stream;
}

const Stream& current_stream() {
  const std::vector<const Stream*>& streams = guarded_streams();
  return streams.empty() ? cpu_stream() : *streams.back();
}

StreamGuard::StreamGuard(const Stream& stream) : stack_(&guarded_streams()), stream_(&stream) {
  stack_->push_back(stream_);
}

StreamGuard::~StreamGuard() {
  // The newest entry of this guard's stream: guards of the same stream are interchangeable.
  for (auto it = stack_->rbegin(); it != stack_->rend(); ++it) {
    if (*it == stream_) {
      stack_->erase(std::next(it).base());
      return;
    }
  }
}

}  // namespace ddp
