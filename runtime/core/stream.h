// Move-only owners of CUDA streams and events, with a CPU meaning for each.
//
// Every op takes a Stream, so ordering between compute and communication is expressed with events, never
// with a host synchronisation. On the CPU a Stream is the calling thread (work is done when the call returns)
// and an Event is a completion flag another thread can wait on; the same code path then serves both devices.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/core/device.h"

struct CUstream_st;
struct CUevent_st;

namespace ddp {

// A stream as the kernel layer and the allocators take it: the CUDA handle, or nullptr for the CPU (the
// calling thread) and the legacy default stream.
using StreamHandle = CUstream_st*;

class Stream {
 public:
  // A CPU "stream": synchronous.
  Stream() = default;
  // Creates a non-blocking CUDA stream on `device` (priority: lower is higher, as in CUDA).
  static Stream create(const Device& device, int priority = 0);
  // A stream someone else owns (an application's cudaStream_t): used, never destroyed. The owner keeps it
  // alive for as long as this Stream and everything ordered on it.
  static Stream borrow(const Device& device, StreamHandle handle);

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  const Device& device() const { return device_; }
  StreamHandle handle() const { return stream_; }  // nullptr for the CPU
  void synchronize() const;
  // Records `cuda_event` (a cudaEvent_t someone else made, an application's) after the work queued so far, so
  // that their streams can wait for it. The CPU stream has nothing queued: nothing to record.
  void record_foreign_event(void* cuda_event) const;

 private:
  Device device_ = Device::cpu();
  CUstream_st* stream_ = nullptr;
  bool owned_ = true;
};

// CPU completion flag shared between an Event and whoever signals it.
class CpuCompletion {
 public:
  void reset();
  void signal();
  void wait() const;
  bool done() const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = true;
};

class Event {
 public:
  Event() = default;  // an empty event: waiting on it returns at once
  // A CUDA event on `device`; `timing` enables elapsed_ms (costs a little on record).
  static Event create(const Device& device, bool timing = false);

  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  // Marks the point in `stream`'s work that later waits refer to. On the CPU the work before it is complete.
  void record(const Stream& stream);
  // Makes `stream` wait, device-side, until the recorded work completes. No host block for CUDA.
  void wait(const Stream& stream) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds between `start` and this event; both need `timing`.
  float elapsed_ms_since(const Event& start) const;
  CUevent_st* handle() const { return event_; }

 private:
  Device device_ = Device::cpu();
  CUevent_st* event_ = nullptr;
};

// Reusable CUDA events of one device, as c10d and llm.c keep theirs: creating events for every collective costs
// host time on every step. acquire() hands out an event (new or recycled) that goes back to the pool when its
// last holder drops it; a recycled event is simply recorded again, which CUDA allows at any time. Thread-safe:
// a watchdog thread may drop the last reference.
class EventPool {
 public:
  EventPool(const Device& device, bool timing);
  std::shared_ptr<Event> acquire();

 private:
  struct Free {
    std::mutex mutex;
    std::vector<Event> events;
  };
  Device device_;
  bool timing_;
  std::shared_ptr<Free> free_;  // shared with the handed-out events' deleters, so it outlives the pool if need be
};

// A CPU Stream for code that has no device stream at hand (the calling thread).
const Stream& cpu_stream();

// This thread's current stream, as PyTorch's: what every public call that takes `const Stream& stream =
// current_stream()` runs on when the program passes none (ops, a module's forward, an optimizer's step, zero_grad,
// Tensor's factories and copies). A Session makes its stream current on the thread that constructs it, for as
// long as it lives, so a program with one session never names a stream; without one (and on any other thread)
// it is cpu_stream(). Passing a stream explicitly always wins.
const Stream& current_stream();

// Makes `stream` this thread's current stream while the guard lives (`stream` must outlive it). Guards may end
// in any order: each takes back its own stream, and the current stream is the one of the newest guard still
// alive on this thread (cpu_stream() when none is). End it on the thread that made it.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  std::vector<const Stream*>* stack_;  // this thread's guarded streams, oldest first
  const Stream* stream_;
};

}  // namespace ddp
