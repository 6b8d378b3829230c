// Session: this process's part in a distributed job, everything a training program needs from it in one object.
//
//   ddp::Session session(&argc, &argv);                       // MPI, rank, GPU, stream, backend, process group
//   ddp::DistributedDataParallel ddp_model(model, session);   // uses the session's stream and process group
//   double mean_loss = session.mean(loss.item(session.stream()));
//
// Construction starts MPI (or joins an MPI the program started itself), binds this rank to GPU
// `local_rank % gpus` (or runs on the CPU, saying why once), creates the default stream, sets the CPU kernels'
// threads to this rank's share of the node's cores, and chooses the gradient backend: the option, else
// DDP_BACKEND (ddprun --backend sets it), else NCCL on GPUs and MPI on the CPU. Every failure of these steps
// ends every rank with one message naming the ranks (a CollectiveError), never a hang. Started without mpirun
// (Open MPI's singleton mode) the session is a world of one.
//
// The process group is created the first time group() is called (DistributedDataParallel does), so that a
// program that never communicates gradients pays nothing for it. Creating it is collective: every rank must
// reach that first call.
//
// Host collectives (sum, max, mean, any, agree) are for the handful of numbers a training loop exchanges: a
// mean loss, a count of correct predictions, "did any rank see a NaN". Every rank calls them in the same order;
// each blocks until all ranks have called it. They never touch a stream.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stop_request.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/job.h"
#include "runtime/distributed/process_group.h"

namespace ddp {

class World;  // the bootstrap underneath (runtime/distributed/world.h, internal)

struct SessionOptions {
  // Where the ranks run: kAuto takes the GPUs when every rank has one, else the CPU; kCuda refuses to start
  // without a GPU. parse_device_request("auto" | "cpu" | "cuda") reads a flag.
  DeviceRequest device = DeviceRequest::kAuto;
  // "nccl", "mpi", or "" / "auto" for the default (DDP_BACKEND, else NCCL on GPUs and MPI on the CPU). NCCL
  // needs one GPU per rank; the MPI backend also lets several ranks share a GPU (host staging).
  std::string backend;
  // False: no process group (and no NCCL communicator); the host collectives still work. For programs that
  // run one independent model per rank.
  bool process_group = true;
  // OpenBLAS threads per rank when running on the CPU; 0: OPENBLAS_NUM_THREADS or OMP_NUM_THREADS when set, else
  // the node's cores divided by its ranks.
  int cpu_threads = 0;
  // Deadline for creating the NCCL communicator.
  double nccl_init_timeout_s = 120.0;
  // For an application that runs on the GPU itself: its device (-1: rank r takes GPU `local_rank % gpus`) and
  // its cudaStream_t, which becomes the session's stream (borrowed: the application keeps it alive until the
  // session is gone, and destroys it). nullptr: the session creates its own, which stream() hands over.
  int cuda_device = -1;
  void* cuda_stream = nullptr;
};

// A command line as named settings for Session::agree_same: "--name value" and "--name=value" as (--name,
// value), a flag followed by another flag or by nothing as (--name, ""), any other argument as ("argument K",
// it). argv[0] is left out.
std::vector<std::pair<std::string, std::string>> command_line_settings(int argc, char** argv);

class Session {
 public:
  // Collective over all ranks of the job. Throws CollectiveError (every rank alike) when a rank cannot bind
  // its device, the backend is unknown or cannot serve the device (NCCL on the CPU), or NCCL cannot start.
  Session(int* argc, char*** argv, SessionOptions options = {});
  // A session of an MPI application on its own communicator (ddp::communicator(MPI_Comm) in ddp_mpi.h): the
  // application owns MPI (MPI_Init_thread at MPI_THREAD_MULTIPLE, MPI_Finalize after the session is gone), and
  // the session talks only over its duplicate of `comm`. Collective over `comm`. Throws InvalidArgument on the
  // calling rank alone, before communicating, for MPI not running, a lower thread level or a null communicator
  // (World's constructor); then as the other constructor.
  Session(ApplicationCommunicator comm, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const;  // rank among the ranks of this node
  int local_size() const;
  // Rank 0: the one that prints and writes files, by convention.
  bool is_lead() const { return rank_ == 0; }
  const Device& device() const;
  // The default stream of device(): everything the session builds (DistributedDataParallel, the checkpoint
  // helpers) runs on it, and it is the current stream (ddp::current_stream()) of the thread that made the
  // session while the session lives, so every op, forward, step and zero_grad runs on it unless given a
  // second stream of one's own (Stream::create(session.device()), ordered with Events; or made current for a
  // scope with a StreamGuard). On the CPU it is the calling thread.
  const Stream& stream() const { return stream_; }
  Backend backend() const { return backend_; }
  // OpenBLAS threads of this rank (0 when running on a GPU: the session did not set them).
  int cpu_threads() const { return cpu_threads_; }

  // The process group of device() with backend(), made on the first call (collective: every rank must make
  // that first call). Throws InvalidArgument when the session was made with process_group = false.
  ProcessGroup& group();
  // The bootstrap underneath, for the runtime's own code and tests (abort, the NCCL communicator): World is
  // internal, complete only with runtime/distributed/world.h, which ddp.h does not reach.
  World& world() { return *world_; }
  const World& world() const { return *world_; }

  // ---- Host collectives (blocking, every rank in the same order) ----
  double sum(double value) const;
  double max(double value) const;
  double mean(double value) const { return sum(value) / size_; }
  // True on every rank when `flag` is true on any rank.
  bool any(bool flag) const;
  // Elementwise sums of every rank's `values` (all ranks pass the same count), in one collective.
  std::vector<double> sum(std::vector<double> values) const;
  // Every rank passes its own error ("" when fine); if any rank failed, every rank throws one CollectiveError
  // whose message is `what` followed by each failing rank's error ("ranks 0,2: ..."). run_main prints it once.
  // AgreedError::kInput for an error in the job's input (flags, data): the program then exits with
  // kInputErrorExitStatus, which ddprun --max-restarts does not restart.
  void agree(const std::string& local_error, const std::string& what,
             AgreedError kind = AgreedError::kMayPassOnRetry) const;
  // Every rank passes its values of the same named settings (flags, a recipe); any that differ across ranks
  // end every rank with one message naming the setting and the ranks (World::agree_same). Call it right after
  // parsing the flags: a learning rate that differs on one rank trains silently wrong, an epoch count that
  // differs ends in a hang or a truncated message later.
  void agree_same(const std::vector<std::pair<std::string, std::string>>& settings, const std::string& what) const;
  // A graceful stop (runtime/core/stop_request.h: SIGTERM, SIGINT or SIGUSR1 once the program has called
  // ddp::install_stop_handlers(), or ddp::request_stop()): true on every rank once any rank was asked. Checked
  // at the same point of every rank's loop (after a step), so that all ranks stop after the same step.
  // Once true, this rank is noted as stopping (ddp::note_stopping), so that an error on the way (a checkpoint
  // that cannot be written) ends it with ddp::kStopFailedExitStatus, which ddprun never restarts.
  bool stop_requested() const;

 private:
  void start(const SessionOptions& options);

  std::unique_ptr<World> world_;
  int rank_ = 0;
  int size_ = 1;
  Stream stream_;
  std::unique_ptr<StreamGuard> current_;  // stream_ as the constructing thread's current stream
  Backend backend_ = Backend::kMpi;
  bool wants_group_ = true;
  int cpu_threads_ = 0;
  std::unique_ptr<ProcessGroup> group_;
};

}  // namespace ddp
