// Collectives over the world's ranks, each returning a Work handle, with one interface and two backends:
// NCCL for CUDA buffers (on its own communication stream) and MPI for CPU buffers (on one communication
// thread that makes every MPI call; CUDA buffers go through pinned host staging, or straight to MPI where it
// is CUDA-aware). The MPI backend is how several ranks share one GPU.
//
// Ordering: a collective on a CUDA buffer starts only after the work already queued on the caller's `stream`
// (device-side wait, no host block), and Work::wait(stream) makes `stream` wait for the collective the same
// way. On the CPU, `stream` is the calling thread: the collective reads the buffer once it is queued, so the
// caller must not touch the buffer until wait() returns. Point-to-point transfers (send_recv) follow the same
// rules.
//
// Every rank must issue the same collectives in the same order (a missing one is reported by the watchdog
// after DDP_COLLECTIVE_TIMEOUT_S, naming the rank and the collective, and ends the job).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class World;


enum class ReduceOp { kSum, kAverage, kMax, kMin };


// A contiguous buffer to communicate: `count` elements of `dtype` on `device`.
struct CommBuffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();

  std::size_t bytes() const { return static_cast<std::size_t>(count) * dtype_size(dtype); }
  // The whole of `tensor` (contiguous, as every Tensor is; a view is its own slice of the storage).
  static CommBuffer of(const Tensor& tensor) {
    return CommBuffer{tensor.data_ptr(), tensor.numel(), tensor.dtype(), tensor.device()};
  }
};

// A buffer to send to, or to receive from, one peer rank.
struct PeerBuffer {
  CommBuffer buffer;
  int peer = 0;
};

// What a collective is for, kept as numbers and put into words only when a message needs them, so that issuing
// a collective builds no string: "bucket 2 of 4 (512 KiB) in backward 40".
struct CollectiveContext {
  int bucket = -1;  // -1: not a gradient bucket (nothing to say)
  int buckets = 0;
  std::size_t bytes = 0;
  std::int64_t backward = 0;
  // The phase the collective belongs to: a bucket's gradients in "backward" N, or (sharded optimizer) its
  // updated parameters in "the optimizer step after backward" N.
  const char* phase = "backward";  // a string literal
  std::string text() const;
};

enum class Backend { kNccl, kMpi };

// A collective as errors and the watchdog name it: "rank 1's ncclAllReduce #7 of 4096 float32 elements (nccl)
// for bucket 0 of 2 (16 KiB) in backward 3". `seq` is its number in the flight recorder (flight_recorder.h).
struct CollectiveDescription {
  const char* operation = "";  // a string literal
  std::int64_t seq = 0;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  Backend backend = Backend::kNccl;
  int rank = 0;
  CollectiveContext context;
  std::string text() const;
};

// What a collective returns: completion, waiting, and its error.
class Work {
 public:
  virtual ~Work() = default;
  // True once the collective finished (successfully or not). Never blocks.
  virtual bool is_completed() = 0;
  // Orders `stream` after the collective: device-side for CUDA streams, blocking for the CPU. Throws the
  // collective's error, if it had one.
  virtual void wait(const Stream& stream) = 0;
  // Blocks the calling thread until the collective finished; throws its error.
  virtual void synchronize() = 0;
  // The error the collective ended with, if any (null while running or after success).
  virtual std::exception_ptr exception() = 0;
  // Milliseconds the collective itself took (from its start on the communication stream or thread to its
  // end); available once completed, negative when unknown.
  virtual double duration_ms() = 0;
  // When the collective began, in milliseconds after a reference point: `device_reference`, an event recorded
  // with timing on a stream of the same device (CUDA backends), or `host_reference` (backends on a thread).
  // Available once completed; negative when unknown.
  virtual double start_ms_since(const Event* device_reference,
                                std::chrono::steady_clock::time_point host_reference) = 0;
};

// A collective with nothing to do, complete when made: in a world of one, an in-place all-reduce or broadcast
// leaves the buffer as it is (the sum, average or maximum of one value is that value) and a barrier waits for
// nobody, so neither backend launches, queues or watches anything for them. It began, and ended, when it was issued (on the host's clock).
class CompletedWork : public Work {
 public:
  bool is_completed() override { return true; }
  void wait(const Stream&) override {}
  void synchronize() override {}
  std::exception_ptr exception() override { return nullptr; }
  double duration_ms() override { return 0.0; }
  double start_ms_since(const Event*, std::chrono::steady_clock::time_point host_reference) override {
    return std::chrono::duration<double, std::milli>(issued_ - host_reference).count();
  }

 private:
  std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

// "nccl" | "mpi"; anything else is an InvalidArgument naming the choices.
Backend parse_backend(const std::string& text);
std::string backend_name(Backend backend);
// The backend for `device`: NCCL for CUDA and MPI for the CPU, unless DDP_BACKEND says otherwise.
Backend default_backend(const Device& device);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;

  // In place over every rank's `buffer`. kAverage divides the sum by size().
  virtual std::shared_ptr<Work> all_reduce(const CommBuffer& buffer, ReduceOp op, const Stream& stream) = 0;
  // In place: every rank receives `root`'s buffer.
  virtual std::shared_ptr<Work> broadcast(const CommBuffer& buffer, int root, const Stream& stream) = 0;
  // `output` holds size() * input.count elements, rank r's input at offset r * input.count. In place when
  // `input` is rank r's slice of `output` (as NCCL allows); any other overlap is refused.
  virtual std::shared_ptr<Work> all_gather(const CommBuffer& input, const CommBuffer& output,
                                           const Stream& stream) = 0;
  // `input` holds size() * output.count elements; rank r receives the reduction of every rank's slice r. In
  // place when `output` is rank r's slice of `input` (the rest of `input` is then undefined afterwards); any
  // other overlap is refused. Sizes that do not split evenly are padded by the caller (the sharded DDP pads
  // each bucket to a multiple of the world size).
  virtual std::shared_ptr<Work> reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op,
                                               const Stream& stream) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // Point to point: sends each buffer of `sends` to its peer and receives each buffer of `recvs` from its peer,
  // all as one operation (an NCCL group; MPI_Isend/MPI_Irecv and one wait), so ranks exchanging with each
  // other cannot deadlock whatever order they list their buffers in. Buffers between two ranks match in the
  // order listed: this rank's k-th send to rank p is p's k-th receive from this rank, with the same count and
  // dtype. A rank that has nothing to exchange at a step need not call it. InvalidArgument for a peer that is
  // no rank or a buffer on another device than the group's.
  virtual std::shared_ptr<Work> send_recv(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                                          const Stream& stream) = 0;
  std::shared_ptr<Work> send(const CommBuffer& buffer, int peer, const Stream& stream) {
    return send_recv({PeerBuffer{buffer, peer}}, {}, stream);
  }
  std::shared_ptr<Work> recv(const CommBuffer& buffer, int peer, const Stream& stream) {
    return send_recv({}, {PeerBuffer{buffer, peer}}, stream);
  }

  // What the next collectives are for (a gradient bucket of a backward): the watchdog's message names it.
  void set_context(const CollectiveContext& context) { context_ = context; }
  const CollectiveContext& context() const { return context_; }

 protected:
  // Every collective starts here, on the calling thread, before it is queued: it gets its sequence number in
  // the flight recorder, and under DDP_DEBUG=collectives the ranks compare it first (a difference throws a
  // CollectiveError on every rank, naming both sides). `root` (broadcasts) and `reduce` (reductions) take
  // part in the comparison.
  CollectiveDescription issue(const char* collective, const CommBuffer& buffer, int root = -1,
                              std::optional<ReduceOp> reduce = std::nullopt) const;
  // Every send_recv starts here: checks the peers (InvalidArgument naming the bad one) and records it in the
  // flight recorder by its element count. Not compared across ranks: only the ranks it pairs take part.
  CollectiveDescription issue_transfers(const char* operation, const std::vector<PeerBuffer>& sends,
                                        const std::vector<PeerBuffer>& recvs) const;

 private:
  CollectiveContext context_;
};

// How `part` (count elements) lies in `whole` (size·count elements of the same type) for an in-place
// all_gather or reduce_scatter of rank `rank`: true when it is exactly slice `rank`, false when the two do not
// overlap; any other overlap throws InvalidArgument naming `what`.
bool is_own_slice(const CommBuffer& part, const CommBuffer& whole, int rank, const char* what);

// The process group of `world` for buffers on `device` with `backend` (a Session makes its own with this).
// Collective: every rank calls it at the same point. Throws InvalidArgument for NCCL on a CPU device, or NCCL
// when the world was created without a communicator.
std::unique_ptr<ProcessGroup> make_process_group(World& world, const Device& device, Backend backend);

}  // namespace ddp
