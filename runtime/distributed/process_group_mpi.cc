#include "runtime/distributed/process_group_mpi.h"

#include <cuda_runtime.h>
#include <mpi-ext.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/core/bfloat16.h"
#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/world_mpi.h"
#include "runtime/kernels/kernels.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// MPI has no bfloat16: a 2-byte type with user-defined sum and max, accumulating each pair in float.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (bf16_to_float(a[i]) > bf16_to_float(b[i])) b[i] = a[i];
  }
}

struct MpiTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_op = MPI_OP_NULL;
  MPI_Op bf16_max_op = MPI_OP_NULL;
};

const MpiTypes& mpi_types() {
  static const MpiTypes types = [] {
    MpiTypes t;
    DDP_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    DDP_MPI_CHECK(MPI_Type_commit(&t.bf16));
    DDP_MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &t.bf16_sum_op));
    DDP_MPI_CHECK(MPI_Op_create(&bf16_max, 1, &t.bf16_max_op));
    return t;
  }();
  return types;
}

MPI_Datatype mpi_type(DType type) {
  switch (type) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kBFloat16:
      return mpi_types().bf16;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    default:
      break;
  }
  throw InternalError(std::string("the MPI backend got a buffer of ") + dtype_name(type) + ", a file-only type");
}

MPI_Op mpi_op(ReduceOp op, DType type) {
  if (type == DType::kBFloat16) {
    if (op == ReduceOp::kMin) throw InvalidArgument("the MPI backend reduces bfloat16 by sum, average or maximum");
    return op == ReduceOp::kMax ? mpi_types().bf16_max_op : mpi_types().bf16_sum_op;
  }
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}


// DDP_MPI_SIMULATE_CUDA_AWARE=1, a test seam (runtime/core/settings.h): the backend behaves as over a CUDA-aware
// MPI (averages divided by a device kernel in device memory, on its stream) while the MPI calls themselves still
// get host copies, so that path runs for real on a machine whose MPI is not CUDA-aware.
bool simulate_cuda_aware() { return settings::flag(settings::setting("DDP_MPI_SIMULATE_CUDA_AWARE")); }

bool query_cuda_aware() {
// The compile-time macro describes the MPI we built against; the run-time query describes the one we run on.
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

int checked_count(std::int64_t count, const char* what) {
  DDP_CHECK(count >= 0 && count <= INT32_MAX,
            std::string(what) + ": the MPI backend takes at most 2^31-1 elements per collective, got " +
                std::to_string(count));
  return static_cast<int>(count);
}

}  // namespace

// Pinned host memory and a copy stream, for CUDA buffers when MPI is not CUDA-aware. Grows, never shrinks.
struct ProcessGroupMpi::Staging {
  Device device = Device::cpu();
  Stream copy_stream;
  void* host = nullptr;
  std::size_t capacity = 0;

  ~Staging() {
    if (host != nullptr) DDP_CUDA_WARN(cudaFreeHost(host));
  }

  void* reserve(std::size_t bytes) {
    if (bytes > capacity) {
      if (host != nullptr) DDP_CUDA_CHECK(cudaFreeHost(host));
      host = nullptr;
      DDP_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
      capacity = bytes;
    }
    return host;
  }

  // Copies between device and host on the copy stream and waits: the communication thread owns this.
  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    CudaDeviceGuard guard(device);
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copy_stream.handle()));
    copy_stream.synchronize();
  }

  // An average's division in device memory, on the copy stream, waited for here (the communication thread
  // signals the work complete only after it): where a CUDA-aware MPI left the sum.
  void divide_on_device(const CommBuffer& b, int size) {
    CudaDeviceGuard guard(device);
    kernels::cuda::divide(b.dtype, b.data, b.count, size, copy_stream.handle());
    copy_stream.synchronize();
  }

  // After an in-place MPI_Reduce_scatter: the result, at the start of `in`, to `out` (a later slice of
  // `in`, so the two never overlap), where the buffers are (host memory, or device memory for a CUDA-aware MPI).
  void move_to_slice(const CommBuffer& in, const CommBuffer& out) {
    if (!in.device.is_cuda()) {
      std::memcpy(out.data, in.data, out.bytes());
      return;
    }
    copy(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice);
  }

  // Runs `call(send, recv)` for a collective from `in` into `out`: on the buffers themselves (CPU, or a
  // CUDA-aware MPI), or, when `stage`, on host copies here (`in` copied in first, `out` copied back after).
  template <typename Call>
  void on_host(bool stage, const CommBuffer& in, const CommBuffer& out, Call&& call) {
    if (!stage) {
      call(in.data, out.data);
      return;
    }
    auto* host = static_cast<char*>(reserve(in.bytes() + out.bytes()));
    copy(host, in.data, in.bytes(), cudaMemcpyDeviceToHost);
    call(host, host + in.bytes());
    copy(out.data, host + in.bytes(), out.bytes(), cudaMemcpyHostToDevice);
  }
};

class ProcessGroupMpi::MpiWork : public Work {
 public:
  MpiWork() { done_.reset(); }

  bool is_completed() override { return done_.done(); }
  void wait(const Stream&) override { synchronize(); }
  void synchronize() override {
    done_.wait();
    if (error_) std::rethrow_exception(error_);
  }
  std::exception_ptr exception() override { return done_.done() ? error_ : nullptr; }
  double duration_ms() override { return done_.done() ? duration_ms_ : -1.0; }

  double start_ms_since(const Event*, Clock::time_point host_reference) override {
    if (!done_.done()) return -1.0;
    return std::chrono::duration<double, std::milli>(started_ - host_reference).count();
  }

  void start() { started_ = Clock::now(); }

  void finish(std::exception_ptr error, double duration_ms) {
    error_ = error;
    duration_ms_ = duration_ms;
    done_.signal();
  }

 private:
  CpuCompletion done_;
  std::exception_ptr error_;
  double duration_ms_ = -1.0;
  Clock::time_point started_;
};

ProcessGroupMpi::ProcessGroupMpi(MPI_Comm comm, const Device& device, double timeout_s)
    : device_(device), staging_(std::make_unique<Staging>()) {
  int provided = 0;
  DDP_MPI_CHECK(MPI_Query_thread(&provided));
  DDP_CHECK(provided == MPI_THREAD_MULTIPLE,
            "the MPI backend runs collectives on its own thread and needs MPI_THREAD_MULTIPLE; this MPI provides "
            "level " + std::to_string(provided));
  // Under the collective deadline: a rank that never makes its group (a C program calling ddp_model_distribute on
  // some ranks only) ends the job with a report instead of leaving the others in MPI_Comm_dup for ever.
  run_host_collective("MPI_Comm_idup (making the MPI process group)", 0, DType::kUInt8,
                      [&](MPI_Request* request) { return MPI_Comm_idup(comm, &comm_, request); });
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  mpi_types();
  if (device_.is_cuda()) {
    cuda_aware_ = query_cuda_aware() || simulate_cuda_aware();
    // The test seam (see simulate_cuda_aware): MPI still gets host copies, everything around it is CUDA-aware.
    mpi_takes_device_pointers_ = cuda_aware_ && !simulate_cuda_aware();
    staging_->device = device_;
    staging_->copy_stream = Stream::create(device_);
    ready_events_ = std::make_unique<EventPool>(device_, /*timing=*/false);
  }
  thread_ = std::thread([this] { loop(); });
  watchdog_ = std::make_unique<Watchdog>(rank_, timeout_s, nullptr, nullptr);
}

ProcessGroupMpi::~ProcessGroupMpi() {
  watchdog_.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  staging_.reset();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void ProcessGroupMpi::loop() {
  // Collectives already queued still run at shutdown: the other ranks are waiting for them.
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

std::shared_ptr<Work> ProcessGroupMpi::enqueue(const CollectiveDescription& what, const Stream& stream,
                                               std::function<void(Staging&)> body) {
  auto work = std::make_shared<MpiWork>();
  // A CUDA producer's work must be complete before the thread reads the buffer.
  std::shared_ptr<Event> ready;
  if (stream.handle() != nullptr) {
    ready = ready_events_->acquire();
    ready->record(stream);
  }
  Task task = [this, work, ready, what, body = std::move(body)] {
    const auto start = Clock::now();
    work->start();
    std::exception_ptr error;
    try {
      if (ready) ready->synchronize();
      body(*staging_);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(Error(what.text() + " failed: " + e.what()));
    }
    record_collective_completed(what.seq);
    work->finish(error, std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!stopping_, "the MPI process group is shutting down");
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  watchdog_->watch(work, what);
  return work;
}

namespace {

// Where MPI reads and writes `buffer`: the buffer itself (CPU, or CUDA-aware MPI) or the staging area.
struct HostView {
  void* data;
  bool staged;
};

}  // namespace

std::shared_ptr<Work> ProcessGroupMpi::all_reduce(const CommBuffer& b, ReduceOp op, const Stream& stream) {
  const int count = checked_count(b.count, "all_reduce");
  const MPI_Op reduction = mpi_op(op, b.dtype);  // an op the type lacks is refused before anything is queued
  if (size_ == 1) return std::make_shared<CompletedWork>();
  const bool stage = b.device.is_cuda() && !mpi_takes_device_pointers_;
  // With a CUDA-aware MPI the sum lands in device memory, and the division follows it there.
  const bool device_average = b.device.is_cuda() && cuda_aware_;
  const int size = size_;
  return enqueue(issue("MPI_Allreduce", b, -1, op), stream, [=, this](Staging& staging) {
    void* data = b.data;
    if (stage) {
      data = staging.reserve(b.bytes());
      staging.copy(data, b.data, b.bytes(), cudaMemcpyDeviceToHost);
    }
    DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, mpi_type(b.dtype), reduction, comm_));
    if (op == ReduceOp::kAverage && !device_average) kernels::cpu::divide(b.dtype, data, b.count, size, nullptr);
    if (stage) staging.copy(b.data, data, b.bytes(), cudaMemcpyHostToDevice);
    if (op == ReduceOp::kAverage && device_average) staging.divide_on_device(b, size);
  });
}

std::shared_ptr<Work> ProcessGroupMpi::broadcast(const CommBuffer& b, int root, const Stream& stream) {
  const int count = checked_count(b.count, "broadcast");
  DDP_CHECK(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) + " is not a rank");
  if (size_ == 1) return std::make_shared<CompletedWork>();
  const bool stage = b.device.is_cuda() && !mpi_takes_device_pointers_;
  return enqueue(issue("MPI_Bcast", b, root), stream, [=, this](Staging& staging) {
    void* data = b.data;
    if (stage) {
      data = staging.reserve(b.bytes());
      if (rank_ == root) staging.copy(data, b.data, b.bytes(), cudaMemcpyDeviceToHost);
    }
    DDP_MPI_CHECK(MPI_Bcast(data, count, mpi_type(b.dtype), root, comm_));
    if (stage && rank_ != root) staging.copy(b.data, data, b.bytes(), cudaMemcpyHostToDevice);
  });
}

std::shared_ptr<Work> ProcessGroupMpi::all_gather(const CommBuffer& in, const CommBuffer& out,
                                                  const Stream& stream) {
  const int count = checked_count(in.count, "all_gather");
  DDP_CHECK(out.count == in.count * size_ && out.dtype == in.dtype,
            "all_gather: output must hold size() * input.count elements of the input's type");
  const bool stage = in.device.is_cuda() && !mpi_takes_device_pointers_;
  // MPI forbids aliased buffers; in place, MPI_IN_PLACE reads this rank's input from its slice of the output.
  // (Staged, the two are separate host copies.)
  const bool in_place = is_own_slice(in, out, rank_, "all_gather") && !stage;
  if (size_ == 1 && in.data == out.data) return std::make_shared<CompletedWork>();
  return enqueue(issue("MPI_Allgather", in), stream, [=, this](Staging& staging) {
    staging.on_host(stage, in, out, [&](const void* send, void* recv) {
      DDP_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, count, mpi_type(in.dtype), recv, count,
                                  mpi_type(in.dtype), comm_));
    });
  });
}

std::shared_ptr<Work> ProcessGroupMpi::reduce_scatter(const CommBuffer& in, const CommBuffer& out, ReduceOp op,
                                                      const Stream& stream) {
  const int count = checked_count(out.count, "reduce_scatter");
  const MPI_Op reduction = mpi_op(op, in.dtype);
  DDP_CHECK(in.count == out.count * size_ && out.dtype == in.dtype,
            "reduce_scatter: input must hold size() * output.count elements of the output's type");
  const bool stage = in.device.is_cuda() && !mpi_takes_device_pointers_;
  const bool device_average = in.device.is_cuda() && cuda_aware_;
  // In place: MPI_IN_PLACE leaves the result at the start of the input, from where it moves to this rank's slice.
  const bool in_place = is_own_slice(out, in, rank_, "reduce_scatter") && !stage;
  const int size = size_;
  const int rank = rank_;
  if (size == 1 && in.data == out.data) return std::make_shared<CompletedWork>();
  // MPI_Reduce_scatter with equal counts, not MPI_Reduce_scatter_block: the same result, but Open MPI 4.1 runs
  // the block form as a reduce followed by a scatter, far slower than this one, which takes an all-reduce's time.
  return enqueue(issue("MPI_Reduce_scatter", out, -1, op), stream, [=, this](Staging& staging) {
    const std::vector<int> counts(static_cast<std::size_t>(size), count);
    staging.on_host(stage, in, out, [&](const void* send, void* recv) {
      if (in_place) {
        DDP_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, const_cast<void*>(send), counts.data(), mpi_type(in.dtype),
                                         reduction, comm_));
        if (rank != 0) staging.move_to_slice(in, out);
      } else {
        DDP_MPI_CHECK(MPI_Reduce_scatter(send, recv, counts.data(), mpi_type(in.dtype), reduction, comm_));
      }
      if (op == ReduceOp::kAverage && !device_average) kernels::cpu::divide(out.dtype, recv, out.count, size, nullptr);
    });
    if (op == ReduceOp::kAverage && device_average) staging.divide_on_device(out, size);
  });
}

std::shared_ptr<Work> ProcessGroupMpi::send_recv(const std::vector<PeerBuffer>& sends,
                                                 const std::vector<PeerBuffer>& recvs, const Stream& stream) {
  const CollectiveDescription what = issue_transfers("MPI_Isend/MPI_Irecv", sends, recvs);
  for (const std::vector<PeerBuffer>* list : {&sends, &recvs}) {
    for (const PeerBuffer& p : *list) {
      checked_count(p.buffer.count, "send_recv");
      DDP_CHECK(p.buffer.device.is_cpu() || p.buffer.device == device_,
                "send_recv: the MPI backend on " + device_.str() + " got a buffer on " + p.buffer.device.str());
    }
  }
  const bool stage_device_buffers = !mpi_takes_device_pointers_;
  return enqueue(what, stream, [=, this](Staging& staging) {
    // Where MPI reads and writes each buffer: the buffer itself, or its slice of the pinned staging area.
    auto staged = [&](const CommBuffer& b) { return b.device.is_cuda() && stage_device_buffers; };
    std::size_t staged_bytes = 0;
    for (const std::vector<PeerBuffer>* list : {&sends, &recvs})
      for (const PeerBuffer& p : *list) staged_bytes += staged(p.buffer) ? p.buffer.bytes() : 0;
    char* host = staged_bytes > 0 ? static_cast<char*>(staging.reserve(staged_bytes)) : nullptr;
    auto place = [&](const CommBuffer& b) -> void* {
      if (!staged(b)) return b.data;
      void* at = host;
      host += b.bytes();
      return at;
    };
    std::vector<void*> send_at, recv_at;
    for (const PeerBuffer& p : sends) {
      send_at.push_back(place(p.buffer));
      if (send_at.back() != p.buffer.data) {
        staging.copy(send_at.back(), p.buffer.data, p.buffer.bytes(), cudaMemcpyDeviceToHost);
      }
    }
    for (const PeerBuffer& p : recvs) recv_at.push_back(place(p.buffer));
    // Receives posted first, then sends; one wait for all of them.
    std::vector<MPI_Request> requests(sends.size() + recvs.size(), MPI_REQUEST_NULL);
    constexpr int kTag = 17;  // this group's own communicator carries nothing else point to point
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const CommBuffer& b = recvs[i].buffer;
      DDP_MPI_CHECK(MPI_Irecv(recv_at[i], static_cast<int>(b.count), mpi_type(b.dtype), recvs[i].peer, kTag, comm_,
                              &requests[i]));
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const CommBuffer& b = sends[i].buffer;
      DDP_MPI_CHECK(MPI_Isend(send_at[i], static_cast<int>(b.count), mpi_type(b.dtype), sends[i].peer, kTag, comm_,
                              &requests[recvs.size() + i]));
    }
    DDP_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const CommBuffer& b = recvs[i].buffer;
      if (recv_at[i] != b.data) staging.copy(b.data, recv_at[i], b.bytes(), cudaMemcpyHostToDevice);
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::barrier() {
  if (size_ == 1) return std::make_shared<CompletedWork>();
  auto work = enqueue(issue("MPI_Barrier", CommBuffer{}), Stream(), [this](Staging&) { DDP_MPI_CHECK(MPI_Barrier(comm_)); });
  work->synchronize();
  return work;
}

}  // namespace ddp
