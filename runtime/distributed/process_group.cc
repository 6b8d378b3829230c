#include "runtime/distributed/process_group.h"

#include <cstdlib>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/hang_diagnosis/collective_deadline.h"
#include "runtime/distributed/hang_diagnosis/collective_mismatch.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/process_group_mpi.h"
#include "runtime/distributed/process_group_nccl.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {

std::string CollectiveContext::text() const {
  if (bucket < 0) return "";
  return "bucket " + std::to_string(bucket) + " of " + std::to_string(buckets) + " (" + std::to_string(bytes >> 10) +
         " KiB) in " + phase + " " + std::to_string(backward);
}

std::string CollectiveDescription::text() const {
  std::string s = rank_name(rank) + "'s " + operation;
  if (seq > 0) s += " #" + std::to_string(seq);
  if (count > 0) s += " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements";
  s += " (" + backend_name(backend) + ")";
  const std::string what_for = context.text();
  if (!what_for.empty()) s += " for " + what_for;
  return s;
}

CollectiveDescription ProcessGroup::issue(const char* collective, const CommBuffer& buffer, int root,
                                          std::optional<ReduceOp> reduce) const {
  CollectiveDescription d{collective, 0, buffer.count, buffer.dtype, backend(), rank(), context_};
  const std::int64_t step = context_.bucket >= 0 ? context_.backward : current_step();
  d.seq = record_collective_issued(collective, buffer.count, buffer.dtype, context_.bucket, context_.buckets, step);
  if (collective_mismatch_enabled()) {
    const std::string difference = check_collective(CollectiveFingerprint(
        d.seq, collective, buffer.count, buffer.dtype, root, reduce ? static_cast<int>(*reduce) : -1,
        context_.bucket, context_.buckets, step));
    if (!difference.empty()) throw CollectiveError(difference, rank());
  }
  return d;
}

CollectiveDescription ProcessGroup::issue_transfers(const char* operation, const std::vector<PeerBuffer>& sends,
                                                    const std::vector<PeerBuffer>& recvs) const {
  CommBuffer all;
  bool first = true;
  for (const std::vector<PeerBuffer>* list : {&sends, &recvs}) {
    for (const PeerBuffer& p : *list) {
      DDP_CHECK(p.peer >= 0 && p.peer < size(), std::string(operation) + ": peer " + std::to_string(p.peer) +
                                                     " is not a rank of this group of " + std::to_string(size()));
      DDP_CHECK(p.buffer.count >= 0, std::string(operation) + ": negative element count");
      if (first) all.dtype = p.buffer.dtype;
      first = false;
      all.count += p.buffer.count;
    }
  }
  CollectiveDescription d{operation, 0, all.count, all.dtype, backend(), rank(), context_};
  d.seq = record_collective_issued(operation, all.count, all.dtype, context_.bucket, context_.buckets,
                                   current_step());
  return d;
}

Backend parse_backend(const std::string& text) {
  if (text == "nccl") return Backend::kNccl;
  if (text == "mpi") return Backend::kMpi;
  throw InvalidArgument("unknown backend '" + text + "': choose nccl (CUDA tensors, one GPU per rank) or mpi");
}

std::string backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "mpi"; }

Backend default_backend(const Device& device) {
  const std::string name = settings::text(settings::setting("DDP_BACKEND"));
  if (name != "auto") return parse_backend(name);
  return device.is_cuda() ? Backend::kNccl : Backend::kMpi;
}

bool is_own_slice(const CommBuffer& part, const CommBuffer& whole, int rank, const char* what) {
  const auto* p = static_cast<const char*>(part.data);
  const auto* w = static_cast<const char*>(whole.data);
  if (p + part.bytes() <= w || w + whole.bytes() <= p) return false;
  DDP_CHECK(p == w + static_cast<std::size_t>(rank) * part.bytes(),
            std::string(what) + ": the buffers overlap, but not as rank " + std::to_string(rank) +
                "'s slice of the larger one (the only overlap an in-place collective allows)");
  return true;
}

std::unique_ptr<ProcessGroup> make_process_group(World& world, const Device& device, Backend backend) {
  if (backend == Backend::kNccl) {
    DDP_CHECK(device.is_cuda(), "the NCCL backend communicates CUDA buffers; this rank runs on " + device.str() +
                                    ": use the MPI backend (SessionOptions::backend \"mpi\", or DDP_BACKEND=mpi)");
    DDP_CHECK(world.has_nccl(),
              "the NCCL backend needs the world's NCCL communicator, but the world was created without one "
              "(WorldOptions.nccl = false, or DDP_BACKEND=mpi)");
    return std::make_unique<ProcessGroupNccl>(world);
  }
  return std::make_unique<ProcessGroupMpi>(mpi_comm(world), device);
}

}  // namespace ddp
