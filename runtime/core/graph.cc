// CudaGraph: capture (thread-local mode, so only this thread's unsafe calls break it), instantiate, replay.
#include "runtime/core/graph.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "runtime/core/check.h"

namespace ddp {
namespace {

// The replay hooks of the capture running on this thread (captures are thread-local: see capture()).
thread_local std::vector<std::function<void()>>* g_capture_hooks = nullptr;

}  // namespace

void on_each_replay(std::function<void()> host_work) {
  if (g_capture_hooks != nullptr) g_capture_hooks->push_back(std::move(host_work));
}

void now_or_on_each_replay(const Stream& stream, std::function<void()> host_work) {
  if (is_capturing(stream)) {
    on_each_replay(std::move(host_work));
  } else {
    host_work();
  }
}

bool is_capturing(const Stream& stream) {
  if (stream.handle() == nullptr) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DDP_CUDA_CHECK(cudaStreamIsCapturing(stream.handle(), &status));
  return status != cudaStreamCaptureStatusNone;
}

CudaGraph CudaGraph::capture(const Stream& stream, const std::function<void()>& enqueue) {
  DDP_CHECK(stream.handle() != nullptr, "CudaGraph::capture needs a CUDA stream, got the CPU stream");
  CudaDeviceGuard guard(stream.device());
  CudaGraph out;
  cudaError_t rc = cudaStreamBeginCapture(stream.handle(), cudaStreamCaptureModeThreadLocal);
  if (rc != cudaSuccess) {
    out.error_ = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(rc);
    return out;
  }
  g_capture_hooks = &out.replay_hooks_;
  try {
    enqueue();
  } catch (const std::exception& e) {
    out.error_ = e.what();
  }
  g_capture_hooks = nullptr;
  // Ends the capture in every case, so the stream is usable again whatever happened inside.
  cudaGraph_t graph = nullptr;
  rc = cudaStreamEndCapture(stream.handle(), &graph);
  if (out.error_.empty() && rc != cudaSuccess) out.error_ = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(rc);
  if (out.error_.empty()) {
    cudaGraphExec_t exec = nullptr;
    rc = cudaGraphInstantiate(&exec, graph, 0);
    if (rc == cudaSuccess) {
      out.exec_ = exec;
    } else {
      out.error_ = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(rc);
    }
  }
  if (graph != nullptr) DDP_CUDA_WARN(cudaGraphDestroy(graph));
  // A failed capture leaves its error in the last-error slot, where the next launch check would find it.
  if (!out.captured()) (void)cudaGetLastError();
  return out;
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : exec_(std::exchange(other.exec_, nullptr)),
      error_(std::move(other.error_)),
      replay_hooks_(std::move(other.replay_hooks_)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) DDP_CUDA_WARN(cudaGraphExecDestroy(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
    error_ = std::move(other.error_);
    replay_hooks_ = std::move(other.replay_hooks_);
  }
  return *this;
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) DDP_CUDA_WARN(cudaGraphExecDestroy(exec_));
}

void CudaGraph::replay(const Stream& stream) const {
  DDP_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing was captured (" + error_ + ")");
  for (const auto& hook : replay_hooks_) hook();
  DDP_CUDA_CHECK(cudaGraphLaunch(exec_, stream.handle()));
}

}  // namespace ddp
