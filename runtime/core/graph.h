// CudaGraph: the work one stream enqueues, captured once and replayed with one launch.
//
// Why: a small training step is bound by kernel launches (tens of them, a few microseconds of host time each);
// replaying a captured graph costs one launch for the whole step. What a capture may hold: kernels, copies
// between device buffers, event records and waits (other streams that wait on an event of the capturing stream
// join the capture), NCCL collectives, allocations (runtime/core/allocator.h keeps them for the graph). What it
// may not: a host synchronisation, a copy to pageable host memory; each makes the capture fail, and capture()
// says why instead of throwing, so the caller can fall back to running the same work eagerly.
//
// The graph replays the same device addresses: buffers the captured work reads or writes must stay allocated
// (and, when the caller changes them between replays, be changed in place on the same stream). Code that keeps
// host-side state of the device work it enqueues (a cursor it advances, say) registers, while capturing, what
// each replay must do to that state (on_each_replay): replay() runs it on the host before the launch.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/core/stream.h"

struct CUgraphExec_st;

namespace ddp {

// True while `stream` (a CUDA stream) is being captured; false for the CPU stream.
bool is_capturing(const Stream& stream);

// While CudaGraph::capture runs on this thread: `host_work` runs before every replay of the graph being captured
// (an exception it throws stops that replay before its launch). Outside a capture it does nothing: the caller
// does the same work itself for the work it just enqueued, which now_or_on_each_replay does in one call.
void on_each_replay(std::function<void()> host_work);
// `host_work` for work just enqueued on `stream`: at each replay when `stream` is being captured, else now (as
// ResidentDataset's cursor follows its gathers).
void now_or_on_each_replay(const Stream& stream, std::function<void()> host_work);

class CudaGraph {
 public:
  CudaGraph() = default;
  // Captures what `enqueue` puts on `stream` (CUDA). An exception from `enqueue`, or a failure of the capture
  // itself, gives an empty graph whose error() says what happened; the caller cleans up its own state.
  static CudaGraph capture(const Stream& stream, const std::function<void()>& enqueue);

  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  bool captured() const { return exec_ != nullptr; }
  const std::string& error() const { return error_; }
  // One launch of the whole captured work on `stream`, after the work already queued there.
  void replay(const Stream& stream) const;

 private:
  CUgraphExec_st* exec_ = nullptr;
  std::string error_;
  std::vector<std::function<void()>> replay_hooks_;
};

}  // namespace ddp
