// The process's place in the job: MPI world, node-local rank, the GPU it is bound to, and the NCCL communicator.
//
// One World per process. It initialises MPI with thread support (the MPI backend drives MPI from its own
// communication thread), binds rank r to GPU `local_rank % gpus`, and creates the NCCL communicator from a
// unique ID made on rank 0 and broadcast over MPI. Every step that can fail on one rank is agreed on by all
// ranks, so a missing GPU on rank 3 ends ranks 0-2 with the same message instead of leaving them in a
// collective. Started without mpirun, Open MPI's singleton mode gives a world of one.
//
// It also starts what explains a hang: the side channel over which ranks say where they are (side_channel.h)
// and, under DDP_DEBUG=collectives, the comparison of every collective across ranks (collective_mismatch.h). Its
// own host collectives (agree, sum, max) are recorded in the flight recorder and have the collective deadline.
//
// An MPI application that embeds the runtime makes the World on a communicator of its own instead (the world or
// a split of it): the application owns MPI_Init_thread and MPI_Finalize, the World duplicates the communicator so
// that none of the runtime's messages can match the application's, and every rank of that communicator (and only
// those) must make it. See docs/embedding.md.
//
// Internal to the runtime: a program sees the Session (session.h), which owns the World, and the job's public
// names (job.h: DeviceRequest, CollectiveError, ApplicationCommunicator, run_main). MPI stays out of this header
// too: the communicator lives in a WorldMpi that only the runtime's own code sees, through
// runtime/distributed/world_mpi.h; an application's communicator comes in as its Fortran handle (ddp_mpi.h
// converts an MPI_Comm).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/distributed/job.h"

namespace ddp {

class NcclCommunicator;
class SideChannel;
struct WorldMpi;

struct WorldOptions {
  DeviceRequest device = DeviceRequest::kAuto;
  // The CUDA device this rank runs on, for an application that has chosen its own (cudaSetDevice); -1 binds
  // rank r to GPU `local_rank % gpus`.
  int cuda_device = -1;
  // Create an NCCL communicator when the world runs on CUDA. Without it (the MPI backend) several ranks may
  // share a GPU.
  bool nccl = true;
  // Deadline for NCCL communicator creation.
  double nccl_init_timeout_s = 120.0;
};

// Where constructing a World spent its time, in seconds: programs that report their start-up show it.
struct WorldStartup {
  double mpi_s = 0;     // MPI_Init_thread and the world's communicators
  double device_s = 0;  // waiting for the CUDA driver and this rank's device (begun before MPI_Init, see World)
  double nccl_s = 0;    // the NCCL communicator (unique ID broadcast and ncclCommInitRank)
};

class World {
 public:
  // Initialises MPI if nobody has yet (and finalises it in the destructor), or joins an MPI the caller set up.
  World(int* argc, char*** argv, const WorldOptions& options = {});
  // Joins the application's MPI on `comm` (collective over comm: each of its ranks, and no other, makes it).
  // MPI must be initialised (at MPI_THREAD_MULTIPLE) and stays the application's: the World never finalises
  // it. Throws InvalidArgument, on the calling rank alone and before any communication, when MPI is not
  // running, its thread level is too low, or `comm` is null, invalid or an intercommunicator.
  World(ApplicationCommunicator comm, const WorldOptions& options = {});
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& node_name() const { return node_name_; }
  const Device& device() const { return device_; }
  // The MPI side of the world, for the runtime's own MPI calls: complete only in runtime/distributed/world_mpi.h.
  const WorldMpi& mpi() const { return *mpi_; }
  // The world's NCCL communicator; nullptr on the CPU or when options.nccl is false. In a world of one it is
  // made on the first call (its creation is a good part of a second, and the NCCL backend's in-place collectives
  // need none there); in larger worlds at construction, since making it is collective.
  NcclCommunicator* nccl() const;
  // Whether this world has, or makes on first use, an NCCL communicator.
  bool has_nccl() const { return nccl_wanted_; }
  // The communicator if it was made, without making it (for a watchdog's abort).
  NcclCommunicator* nccl_if_made() const { return nccl_.get(); }
  const WorldStartup& startup() const { return startup_; }

  // Collective: every rank passes its own error (empty when fine). If any rank failed, every rank throws a
  // CollectiveError of `kind` whose message names each failing rank and its error, prefixed by `what`.
  void agree(const std::string& local_error, const std::string& what,
             AgreedError kind = AgreedError::kMayPassOnRetry) const;

  // Collective: every rank passes its own values of the same settings (a flag's name and its value as text, in
  // any order); if any setting differs across ranks (or is given on some ranks only), every rank throws a
  // CollectiveError naming each such setting and which ranks have which value:
  //   the ranks were started with different settings:
  //     --lr: 0.5 on rank 1, 0.1 on ranks 0,2,3
  // One small collective when they agree (a digest of the values); the values themselves only when they do not.
  void agree_same(const std::vector<std::pair<std::string, std::string>>& settings, const std::string& what) const;

  // Host-side collectives for the numbers a training loop needs (a mean loss, a count of correct predictions,
  // "did any rank see a non-finite value"). Every rank calls them in the same order; they block until all did.
  double sum(double value) const;
  double max(double value) const;
  void sum_in_place(double* values, int count) const;
  bool any(bool flag) const { return max(flag ? 1.0 : 0.0) > 0.0; }

  // Ends the whole job from this rank: prints "rank R: message" and calls MPI_Abort.
  [[noreturn]] void abort(const std::string& message, int exit_code = 1) const;

 private:
  // Duplicates the communicator of Fortran handle `parent` and learns rank, size, node and the side channel.
  void join(std::int64_t parent);
  void bind_device(const WorldOptions& options);
  void start_nccl(const WorldOptions& options);
  void create_nccl() const;

  int uncaught_at_start_ = 0;  // std::uncaught_exceptions() at construction: more at destruction means unwinding
  bool owns_mpi_ = false;
  std::unique_ptr<WorldMpi> mpi_;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string node_name_;
  Device device_ = Device::cpu();
  bool nccl_wanted_ = false;
  double nccl_init_timeout_s_ = 0;
  mutable std::unique_ptr<NcclCommunicator> nccl_;
  WorldStartup startup_;
  std::unique_ptr<SideChannel> side_channel_;
};

}  // namespace ddp
