#include "runtime/distributed/process_group_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/mpi_nccl_errors.h"

namespace ddp {
namespace {

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    default:
      break;
  }
  throw InternalError(std::string("the NCCL backend got a buffer of ") + dtype_name(type) + ", a file-only type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace

class ProcessGroupNccl::NcclWork : public Work {
 public:
  // `captured`: issued while its stream was captured into a CUDA graph. Such a collective runs only when the
  // graph is replayed, and its events are graph dependencies with no state of their own (querying them fails),
  // so for the host it is complete at once; the stream waits on the graph's own ordering.
  NcclWork(NcclCommunicator& comm, std::shared_ptr<Event> start, std::shared_ptr<Event> done,
           const CollectiveDescription& what, bool captured)
      : comm_(comm), start_(std::move(start)), done_(std::move(done)), what_(what), captured_(captured) {}

  bool is_completed() override { return captured_ || done_->query(); }

  void wait(const Stream& stream) override {
    if (stream.handle() == nullptr) {
      synchronize();
      return;
    }
    done_->wait(stream);  // in a capture: joins the communication stream's work into the graph
  }

  void synchronize() override {
    // Polls instead of cudaEventSynchronize so that an NCCL asynchronous error surfaces instead of a hang.
    while (!is_completed()) {
      if (std::exception_ptr error = communicator_error()) {
        error_ = error;
        std::rethrow_exception(error);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // The communicator's asynchronous error, once a wait has seen one (a collective that completed is fine).
  std::exception_ptr exception() override { return error_; }

  double duration_ms() override { return !captured_ && done_->query() ? done_->elapsed_ms_since(*start_) : -1.0; }

  double start_ms_since(const Event* device_reference, std::chrono::steady_clock::time_point) override {
    if (captured_ || device_reference == nullptr || device_reference->handle() == nullptr || !done_->query()) return -1.0;
    return start_->elapsed_ms_since(*device_reference);
  }

 private:
  std::exception_ptr communicator_error() const {
    try {
      if (comm_.handle() == nullptr) {
        throw NcclError("NCCL", ncclInvalidUsage, what_.text(), "communicator aborted", __FILE__, __LINE__);
      }
      ncclResult_t state = ncclSuccess;
      DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_.handle(), &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        detail::throw_nccl(state, what_.text().c_str(), __FILE__, __LINE__);
      }
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  NcclCommunicator& comm_;
  std::shared_ptr<Event> start_;
  std::shared_ptr<Event> done_;
  CollectiveDescription what_;
  bool captured_;
  std::exception_ptr error_;
};

ProcessGroupNccl::ProcessGroupNccl(const World& world, double timeout_s)
    : world_(world), device_(world.device()), rank_(world.rank()), size_(world.size()),
      timing_events_(world.device(), /*timing=*/true) {
  DDP_ASSERT(world.has_nccl(), "ProcessGroupNccl made for a world without NCCL");
  CudaDeviceGuard guard(device_);
  ready_ = Event::create(device_);
  int least = 0;
  int greatest = 0;
  DDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Communication gets the highest priority so a bucket's all-reduce is not starved by backward kernels.
  comm_stream_ = Stream::create(device_, greatest);
  DDP_CUDA_CHECK(cudaMalloc(&barrier_buffer_, sizeof(float)));
  // The watchdog only ever watches collectives that ran, so only a communicator that was made.
  watchdog_ = std::make_unique<Watchdog>(
      rank_, timeout_s,
      [this] {
        if (NcclCommunicator* c = world_.nccl_if_made()) c->abort();
      },
      [this]() -> std::string {
        NcclCommunicator* c = world_.nccl_if_made();
        if (c == nullptr || c->handle() == nullptr) return "";
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(c->handle(), &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
        if (state == ncclSuccess || state == ncclInProgress) return "";
        return detail::nccl_error_string(state);
      });
}

ProcessGroupNccl::~ProcessGroupNccl() {
  watchdog_.reset();
  if (barrier_buffer_ != nullptr) DDP_CUDA_WARN(cudaFree(barrier_buffer_));
}

NcclCommunicator& ProcessGroupNccl::comm() const { return *world_.nccl(); }

void ProcessGroupNccl::check_buffer(const CommBuffer& buffer, const char* what) const {
  DDP_CHECK(buffer.device == device_, std::string(what) + ": the NCCL backend on " + device_.str() +
                                                 " got a buffer on " + buffer.device.str());
  DDP_CHECK(buffer.count >= 0, std::string(what) + ": negative element count");
}

template <typename Launch>
std::shared_ptr<Work> ProcessGroupNccl::run(const Stream& stream, const CollectiveDescription& what, Launch&& launch) {
  NcclCommunicator& communicator = comm();
  DDP_CHECK(communicator.handle() != nullptr, what.text() + ": the NCCL communicator was aborted");
  CudaDeviceGuard guard(device_);
  if (stream.handle() != nullptr) {
    // One event serves every collective: the wait is enqueued at once, after which the event may be re-recorded.
    ready_.record(stream);
    ready_.wait(comm_stream_);
  }
  std::shared_ptr<Event> start = timing_events_.acquire();
  std::shared_ptr<Event> done = timing_events_.acquire();
  start->record(comm_stream_);
  launch();
  done->record(comm_stream_);
  const bool captured = is_capturing(comm_stream_);
  auto work = std::make_shared<NcclWork>(communicator, std::move(start), std::move(done), what, captured);
  if (captured) {
    record_collective_completed(what.seq);  // for the host it is done (see NcclWork); replays are not recorded
  } else {
    watchdog_->watch(work, what);  // nothing to poll in a graph node
  }
  return work;
}

std::shared_ptr<Work> ProcessGroupNccl::all_reduce(const CommBuffer& b, ReduceOp op, const Stream& stream) {
  check_buffer(b, "all_reduce");
  if (size() == 1) return std::make_shared<CompletedWork>();
  return run(stream, issue("ncclAllReduce", b, -1, op), [&] {
    DDP_NCCL_CALL(&comm(), ncclAllReduce(b.data, b.data, b.count, nccl_type(b.dtype), nccl_op(op), comm().handle(),
                                        comm_stream_.handle()));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::broadcast(const CommBuffer& b, int root, const Stream& stream) {
  check_buffer(b, "broadcast");
  DDP_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) + " is not a rank");
  if (size() == 1) return std::make_shared<CompletedWork>();
  return run(stream, issue("ncclBroadcast", b, root), [&] {
    DDP_NCCL_CALL(&comm(), ncclBroadcast(b.data, b.data, b.count, nccl_type(b.dtype), root, comm().handle(),
                                        comm_stream_.handle()));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::all_gather(const CommBuffer& in, const CommBuffer& out,
                                                   const Stream& stream) {
  check_buffer(in, "all_gather");
  check_buffer(out, "all_gather");
  DDP_CHECK(out.count == in.count * size() && out.dtype == in.dtype,
            "all_gather: output must hold size() * input.count elements of the input's type");
  is_own_slice(in, out, rank(), "all_gather");  // NCCL itself takes the in-place form; refuse any other overlap
  if (size() == 1 && in.data == out.data) return std::make_shared<CompletedWork>();
  return run(stream, issue("ncclAllGather", in), [&] {
    DDP_NCCL_CALL(&comm(), ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), comm().handle(),
                                        comm_stream_.handle()));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::reduce_scatter(const CommBuffer& in, const CommBuffer& out, ReduceOp op,
                                                       const Stream& stream) {
  check_buffer(in, "reduce_scatter");
  check_buffer(out, "reduce_scatter");
  DDP_CHECK(in.count == out.count * size() && out.dtype == in.dtype,
            "reduce_scatter: input must hold size() * output.count elements of the output's type");
  is_own_slice(out, in, rank(), "reduce_scatter");
  if (size() == 1 && in.data == out.data) return std::make_shared<CompletedWork>();
  return run(stream, issue("ncclReduceScatter", out, -1, op), [&] {
    DDP_NCCL_CALL(&comm(), ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), nccl_op(op),
                                            comm().handle(), comm_stream_.handle()));
  });
}

std::shared_ptr<Work> ProcessGroupNccl::send_recv(const std::vector<PeerBuffer>& sends,
                                                  const std::vector<PeerBuffer>& recvs, const Stream& stream) {
  const CollectiveDescription what = issue_transfers("ncclSend/ncclRecv", sends, recvs);
  for (const std::vector<PeerBuffer>* list : {&sends, &recvs})
    for (const PeerBuffer& p : *list) check_buffer(p.buffer, "send_recv");
  return run(stream, what, [&] {
    // One group: NCCL pairs every send with its receive only once all are posted, so neighbours exchanging with
    // each other cannot wait on one another. Inside a group a call only records the operation; a failure
    // still ends the group so that the communicator stays usable for the error report.
    DDP_NCCL_CALL(&comm(), ncclGroupStart());
    ncclResult_t status = ncclSuccess;
    const char* failed = "";
    auto post = [&](ncclResult_t result, const char* call) {
      if (status == ncclSuccess && result != ncclSuccess && result != ncclInProgress) {
        status = result;
        failed = call;
      }
    };
    for (const PeerBuffer& p : sends) {
      post(ncclSend(p.buffer.data, p.buffer.count, nccl_type(p.buffer.dtype), p.peer, comm().handle(),
                    comm_stream_.handle()),
           "ncclSend");
    }
    for (const PeerBuffer& p : recvs) {
      post(ncclRecv(p.buffer.data, p.buffer.count, nccl_type(p.buffer.dtype), p.peer, comm().handle(),
                    comm_stream_.handle()),
           "ncclRecv");
    }
    DDP_NCCL_CALL(&comm(), ncclGroupEnd());
    if (status != ncclSuccess) detail::throw_nccl(status, failed, __FILE__, __LINE__);
  });
}

std::shared_ptr<Work> ProcessGroupNccl::barrier() {
  if (size_ == 1) return std::make_shared<CompletedWork>();
  // NCCL has no barrier: a one-element all-reduce that every rank must join is one.
  auto work = run(comm_stream_, issue("barrier", CommBuffer{barrier_buffer_, 1, DType::kFloat32, device_}), [&] {
    DDP_NCCL_CALL(&comm(), ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum,
                                        comm().handle(), comm_stream_.handle()));
  });
  work->synchronize();
  return work;
}

}  // namespace ddp
