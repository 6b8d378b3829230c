// The NCCL backend: every collective runs on one high-priority communication stream, ordered after the
// caller's stream with an event, so compute and communication overlap and the host never blocks. In a world of
// one, in-place collectives and the barrier are complete at once and the world's communicator is not even made
// (World::nccl makes it on the first collective that needs it).
#pragma once

#include <memory>

#include "runtime/core/stream.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/watchdog.h"
#include "runtime/distributed/world.h"

namespace ddp {

class ProcessGroupNccl : public ProcessGroup {
 public:
  explicit ProcessGroupNccl(const World& world, double timeout_s = default_collective_timeout_s());
  ~ProcessGroupNccl() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kNccl; }
  const Stream& comm_stream() const { return comm_stream_; }

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
  class NcclWork;
  // Orders the communication stream after `stream`, runs `launch` there between timing events.
  template <typename Launch>
  std::shared_ptr<Work> run(const Stream& stream, const CollectiveDescription& what, Launch&& launch);
  void check_buffer(const CommBuffer& buffer, const char* what) const;
  NcclCommunicator& comm() const;

  const World& world_;
  Device device_;
  int rank_ = 0;
  int size_ = 1;
  Stream comm_stream_;
  Event ready_;               // the caller's stream -> the communication stream
  EventPool timing_events_;  // each collective's start and end
  float* barrier_buffer_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace ddp
