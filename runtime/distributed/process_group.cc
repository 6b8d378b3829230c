#include "runtime/distributed/process_group.h"

#include <cstdlib>

#include "runtime/core/check.h"
#include "runtime/distributed/process_group_mpi.h"
#include "runtime/distributed/process_group_nccl.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {

std::string CollectiveContext::text() const {
  if (bucket < 0) return "";
  return "bucket " + std::to_string(bucket) + " of " + std::to_string(buckets) + " (" + std::to_string(bytes >> 10) +
         " KiB) in backward " + std::to_string(backward);
}

std::string CollectiveDescription::text() const {
  std::string s = "rank " + std::to_string(rank) + "'s " + operation;
  if (count > 0) s += " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements";
  s += " (" + backend_name(backend) + ")";
  const std::string what_for = context.text();
  if (!what_for.empty()) s += " for " + what_for;
  return s;
}

CollectiveDescription ProcessGroup::describe_transfers(const char* operation, const std::vector<PeerBuffer>& sends,
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
  return describe(operation, all);
}

Backend parse_backend(const std::string& text) {
  if (text == "nccl") return Backend::kNccl;
  if (text == "mpi") return Backend::kMpi;
  throw InvalidArgument("unknown backend '" + text + "': choose nccl (CUDA tensors, one GPU per rank) or mpi");
}

std::string backend_name(Backend backend) { return backend == Backend::kNccl ? "nccl" : "mpi"; }

Backend default_backend(const Device& device) {
  if (const char* env = std::getenv("DDP_BACKEND")) {
    if (*env != '\0') return parse_backend(env);
  }
  return device.is_cuda() ? Backend::kNccl : Backend::kMpi;
}

std::unique_ptr<ProcessGroup> make_process_group(World& world, const Device& device, Backend backend) {
  if (backend == Backend::kNccl) {
    DDP_CHECK(device.is_cuda(), "the NCCL backend communicates CUDA buffers; this rank runs on " + device.str() +
                                    ": use the MPI backend (--backend mpi)");
    DDP_CHECK(world.nccl() != nullptr,
              "the NCCL backend needs the world's NCCL communicator, but the world was created without one "
              "(WorldOptions.nccl = false, or DDP_BACKEND=mpi)");
    return std::make_unique<ProcessGroupNccl>(*world.nccl());
  }
  return std::make_unique<ProcessGroupMpi>(mpi_comm(world), device);
}

}  // namespace ddp
