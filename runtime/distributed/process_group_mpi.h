// The MPI backend: one communication thread makes every MPI call of this group, draining a FIFO of
// collectives in the order they were issued (so every rank issues the same sequence). CPU buffers are reduced
// in place; CUDA buffers go through pinned host staging, or are handed to MPI directly where
// MPIX_Query_cuda_support says it is CUDA-aware. This is the backend that lets several ranks share one GPU.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/distributed/process_group.h"
#include "runtime/distributed/watchdog.h"

namespace ddp {

class ProcessGroupMpi : public ProcessGroup {
 public:
  // Duplicates `comm` for its own traffic. `device` is where the buffers it will be given live.
  ProcessGroupMpi(MPI_Comm comm, const Device& device, double timeout_s = default_collective_timeout_s());
  ~ProcessGroupMpi() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kMpi; }
  bool cuda_aware() const { return cuda_aware_; }

  std::shared_ptr<Work> all_reduce(const CommBuffer& buffer, ReduceOp op, const Stream& stream) override;
  std::shared_ptr<Work> broadcast(const CommBuffer& buffer, int root, const Stream& stream) override;
  std::shared_ptr<Work> all_gather(const CommBuffer& input, const CommBuffer& output,
                                   const Stream& stream) override;
  std::shared_ptr<Work> reduce_scatter(const CommBuffer& input, const CommBuffer& output, ReduceOp op,
                                       const Stream& stream) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send_recv(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs,
                                  const Stream& stream) override;

 private:
  class MpiWork;
  struct Staging;
  using Task = std::function<void()>;

  std::shared_ptr<Work> enqueue(const CollectiveDescription& what, const Stream& stream,
                                std::function<void(Staging&)> body);
  void loop();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  Device device_;
  bool cuda_aware_ = false;                 // device buffers reach MPI as they are (or the test seam says so)
  bool mpi_takes_device_pointers_ = false;  // cuda_aware_ and not simulated
  std::unique_ptr<Staging> staging_;  // owned and used by the communication thread only

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread thread_;
  std::unique_ptr<Watchdog> watchdog_;  // MPI cannot cancel a collective: on a timeout it ends the job
  std::unique_ptr<EventPool> ready_events_;  // CUDA buffers: the producer's work is done when one fires
};

}  // namespace ddp
