#include "runtime/distributed/world.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "runtime/core/phase.h"
#include "runtime/core/settings.h"
#include "runtime/core/start_marker.h"
#include "runtime/core/stop_request.h"
#include "runtime/distributed/hang_diagnosis/collective_deadline.h"
#include "runtime/distributed/hang_diagnosis/collective_mismatch.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/hang_diagnosis/side_channel.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/srun_check.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {
namespace {

// This process's rank in the runtime's communicator, for reports made where no World is at hand (a host
// collective's error). MPI_COMM_WORLD's rank until a World exists.
std::atomic<int> g_runtime_rank{-1};

int runtime_rank() {
  int rank = g_runtime_rank.load();
  if (rank < 0) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// Initialised and not yet finalised: MPI may be called.
bool mpi_is_running() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The node-local rank as the launcher tells it before MPI starts (Open MPI's mpirun, Slurm), or 0 for a process
// started alone; -1 when a launcher we do not know started it.
int local_rank_before_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return std::getenv("PMI_RANK") == nullptr && std::getenv("PMIX_RANK") == nullptr ? 0 : -1;
}

// Starts the CUDA driver and creates the context of the GPU this rank will most likely be bound to (the one
// bind_device picks, local_rank % gpus), on a thread of its own: both take a good part of a second and need
// nothing from MPI, whose start-up takes as long. A wrong guess costs a context on another GPU, nothing else.
std::future<void> warm_up_device(DeviceRequest request) {
  if (request == DeviceRequest::kCpu) return {};
  const int local_rank = local_rank_before_mpi();
  if (local_rank < 0) return {};
  return std::async(std::launch::async, [local_rank] {
    const CudaAvailability& cuda = cuda_availability();
    if (cuda.device_count <= 0) return;
    if (cudaSetDevice(local_rank % cuda.device_count) == cudaSuccess) (void)cudaFree(nullptr);
    (void)cudaGetLastError();  // whatever failed here fails again, and is reported, in bind_device
  });
}

}  // namespace

DeviceRequest parse_device_request(const std::string& text) {
  if (text == "auto") return DeviceRequest::kAuto;
  if (text == "cpu") return DeviceRequest::kCpu;
  if (text == "cuda") return DeviceRequest::kCuda;
  throw InvalidArgument("unknown device '" + text + "': choose one of auto, cpu, cuda");
}

void run_host_collective(const char* operation, std::int64_t count, DType dtype,
                         const std::function<int(MPI_Request*)>& start) {
  const int rank = runtime_rank();
  // A malformed DDP_* variable (a DDP_COLLECTIVE_TIMEOUT_S out of bounds) ends every rank here, in the first
  // collective, with one message (ddprun gives every rank the same environment).
  static const std::string settings_error = settings::environment_errors();
  if (!settings_error.empty()) throw CollectiveError(settings_error, rank);
  const std::int64_t step = current_step();
  const std::int64_t seq = record_collective_issued(operation, count, dtype, -1, 0, step);
  if (collective_mismatch_enabled()) {
    const std::string difference =
        check_collective(CollectiveFingerprint(seq, operation, count, dtype, -1, -1, -1, 0, step));
    if (!difference.empty()) throw CollectiveError(difference, rank);
  }
  MPI_Request request = MPI_REQUEST_NULL;
  DDP_MPI_CHECK(start(&request));
  wait_within_deadline(&request, [&] {
    const std::string elements =
        count > 0 ? " of " + std::to_string(count) + " " + dtype_name(dtype) + " elements" : "";
    return rank_name(rank) + "'s " + operation + " #" + std::to_string(seq) + elements + " (host)";
  });
  record_collective_completed(seq);
}

namespace {

// A start refused before MPI exists: the first task says why and every task exits at once. Not an exception:
// nothing is there to clean up, and unwinding would wait for whatever the program began meanwhile (train_mlp
// reads its data set on other threads), while the refusal must come within seconds.
[[noreturn]] void refuse_start(const std::string& problem, const std::map<std::string, std::string>& env) {
  const auto task = env.find("SLURM_PROCID");
  if (task == env.end() || task->second == "0") {
    std::fprintf(stderr, "ddp: error: %s\n", problem.c_str());
    std::fflush(stderr);
  }
  std::_Exit(1);
}

}  // namespace

#ifdef OMPI_MAJOR_VERSION
constexpr bool kOpenMpi = true;
#else
constexpr bool kOpenMpi = false;
#endif

std::string mpi_thread_level_problem() {
  if (!mpi_is_running()) {
    return "MPI is not running: the application must call MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
           "&provided) (Fortran: call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)) before making a "
           "session on its communicator, and MPI_Finalize only after the last session is gone";
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_MULTIPLE) return "";
  return std::string("MPI was initialised at ") + thread_level_name(provided) +
         ", but the runtime needs MPI_THREAD_MULTIPLE (its communication thread calls MPI while the application's "
         "threads may call it too): initialise MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
         "&provided) (Fortran: call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)) instead of MPI_Init, "
         "and check that provided is MPI_THREAD_MULTIPLE";
}

World::World(int* argc, char*** argv, const WorldOptions& options)
    : uncaught_at_start_(std::uncaught_exceptions()), mpi_(std::make_unique<WorldMpi>()) {
  // srun without a PMI the MPI library can use: refused before anything starts (srun_check.h).
  const std::map<std::string, std::string> srun_env = srun_environment();
  int already = 0;
  MPI_Initialized(&already);
  if (const std::string problem = already ? "" : srun_start_problem(srun_env, kOpenMpi); !problem.empty()) {
    refuse_start(problem, srun_env);
  }
  std::future<void> device_warm_up = warm_up_device(options.cuda_device >= 0 ? DeviceRequest::kCpu : options.device);
  const auto mpi_start = std::chrono::steady_clock::now();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // ddprun names a rank that never gets through MPI_Init, where the others would wait without a deadline.
    tell_launcher_start(/*mpi_ready=*/false);
    DDP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    tell_launcher_start(/*mpi_ready=*/true);
    owns_mpi_ = true;
    if (provided < MPI_THREAD_SERIALIZED) {
      // The communication thread makes every MPI call, but the main thread still calls MPI for setup and
      // agreement; MPI_THREAD_SERIALIZED is the least that supports that with our own locking (the MPI backend
      // asks for MPI_THREAD_MULTIPLE when it starts).
      throw Error("MPI provides thread level " + std::string(thread_level_name(provided)) +
                  "; the runtime needs at least MPI_THREAD_SERIALIZED");
    }
  }
  join(MPI_Comm_c2f(MPI_COMM_WORLD));
  if (const std::string problem = singleton_problem(size_, srun_env); !problem.empty()) throw Error(problem);
  startup_.mpi_s = seconds_since(mpi_start);

  const auto device_start = std::chrono::steady_clock::now();
  if (device_warm_up.valid()) device_warm_up.wait();
  bind_device(options);
  startup_.device_s = seconds_since(device_start);
  start_nccl(options);
}

World::World(ApplicationCommunicator application, const WorldOptions& options)
    : uncaught_at_start_(std::uncaught_exceptions()), mpi_(std::make_unique<WorldMpi>()) {
  // Checked on this rank alone, before any communication: a refusal must not leave the other ranks waiting
  // in a collective of ours (each rank of a job usually sees the same MPI and passes the same kind of handle).
  if (const std::string problem = mpi_thread_level_problem(); !problem.empty()) throw InvalidArgument(problem);
  const std::int64_t handle = application.fortran_handle;
  MPI_Comm parent = MPI_COMM_NULL;
  if (handle >= 0 && handle <= std::numeric_limits<MPI_Fint>::max()) parent = MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
  if (parent == MPI_COMM_NULL) {
    throw InvalidArgument("the communicator passed is MPI_COMM_NULL or not a valid handle (Fortran handle " +
                          std::to_string(handle) + "): pass a communicator this rank belongs to, such as "
                          "MPI_COMM_WORLD or one from MPI_Comm_split (a rank that MPI_Comm_split left out with "
                          "MPI_UNDEFINED gets MPI_COMM_NULL and must not make a session)");
  }
  int inter = 0;
  if (MPI_Comm_test_inter(parent, &inter) != MPI_SUCCESS) {
    throw InvalidArgument("the communicator passed (Fortran handle " + std::to_string(handle) +
                          ") is not a valid communicator: pass MPI_COMM_WORLD or one made by MPI_Comm_split/dup");
  }
  if (inter) {
    throw InvalidArgument("the communicator passed is an intercommunicator: pass an intracommunicator (for "
                          "example from MPI_Intercomm_merge) whose ranks all train");
  }
  const auto mpi_start = std::chrono::steady_clock::now();
  join(handle);
  startup_.mpi_s = seconds_since(mpi_start);
  const auto device_start = std::chrono::steady_clock::now();
  bind_device(options);
  startup_.device_s = seconds_since(device_start);
  start_nccl(options);
}

void World::join(std::int64_t parent_handle) {
  const MPI_Comm parent = MPI_Comm_f2c(static_cast<MPI_Fint>(parent_handle));
  MPI_Comm& comm = mpi_->comm;
  // The runtime's own communicator: no message of ours can match one of the application's on `parent`. The
  // first collective of a session's start has the deadline too: a rank that never makes its session (stuck
  // before it) must not leave the others waiting for ever. A malformed timeout is reported once, later.
  MPI_Request request = MPI_REQUEST_NULL;
  DDP_MPI_CHECK(MPI_Comm_idup(parent, &comm, &request));
  if (settings::environment_errors().empty()) {
    const int world_rank = runtime_rank();
    wait_within_deadline(&request, [world_rank] {
      return "rank " + std::to_string(world_rank) +
             "'s MPI_Comm_idup at the session's start (every rank makes its session together)";
    });
  } else {
    DDP_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
  }
  // Errors come back as status codes (and so as exceptions) instead of aborting inside MPI.
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size_));
  g_runtime_rank.store(rank_);

  MPI_Comm node = MPI_COMM_NULL;
  DDP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  DDP_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  DDP_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_Comm_free(&node);

  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  DDP_MPI_CHECK(MPI_Get_processor_name(name, &length));
  node_name_.assign(name, length);
  // One job-wide side channel and collective comparison per process: a second World (an application that makes a
  // session again after the first ended) starts its own.
  side_channel_ = SideChannel::start(comm);
  const std::string debug_error = start_collective_mismatch(comm);
  if (!debug_error.empty()) throw CollectiveError(debug_error, rank_);
}

void World::start_nccl(const WorldOptions& options) {
  nccl_wanted_ = device_.is_cuda() && options.nccl;
  nccl_init_timeout_s_ = options.nccl_init_timeout_s;
  const auto nccl_start = std::chrono::steady_clock::now();
  // The unique ID goes over this World's communicator: the application's, duplicated.
  if (nccl_wanted_ && size_ > 1) create_nccl();
  startup_.nccl_s = seconds_since(nccl_start);
}

NcclCommunicator* World::nccl() const {
  if (nccl_wanted_ && !nccl_) create_nccl();
  return nccl_.get();
}

void World::bind_device(const WorldOptions& options) {
  const MPI_Comm comm = mpi_->comm;
  const CudaAvailability& cuda = cuda_availability();
  const int gpus = cuda.device_count;

  // Every rank must run on the same kind of device: CUDA only if all ranks have a GPU.
  int local_has_gpu = gpus > 0 ? 1 : 0;
  int all_have_gpu = 0;
  run_host_collective("MPI_Allreduce", 1, DType::kInt32, [&](MPI_Request* request) {
    return MPI_Iallreduce(&local_has_gpu, &all_have_gpu, 1, MPI_INT, MPI_MIN, comm, request);
  });

  std::string error;
  bool use_cuda = false;
  switch (options.device) {
    case DeviceRequest::kCpu:
      break;
    case DeviceRequest::kAuto:
      use_cuda = all_have_gpu == 1;
      if (!use_cuda && rank_ == 0) {
        // One short line: the driver's own words are what --device cuda reports.
        std::fprintf(stderr, "ddp: running on the CPU (%s; asking for the GPU, DeviceRequest::kCuda, says why)\n",
                     gpus == 0 ? "no usable GPU" : "not every rank has a GPU");
      }
      break;
    case DeviceRequest::kCuda:
      use_cuda = true;
      if (gpus == 0) {
        error = "CUDA was asked for, but node " + node_name_ + " has " + cuda.reason +
                ". Ask for the CPU (DeviceRequest::kCpu, or kAuto) on this machine.";
      }
      break;
  }
  if (use_cuda && error.empty() && options.cuda_device >= gpus) {
    error = "the CUDA device given, " + std::to_string(options.cuda_device) + ", is not among node " + node_name_ +
            "'s " + std::to_string(gpus) + " GPU(s): pass an ordinal from 0 to " + std::to_string(gpus - 1);
  }
  if (use_cuda && error.empty() && options.nccl && options.cuda_device < 0 && local_size_ > gpus) {
    error = std::to_string(local_size_) + " ranks share node " + node_name_ + ", which has " +
            std::to_string(gpus) + " GPU(s); NCCL needs one GPU per rank. Start at most " +
            std::to_string(gpus) + " ranks per node, or use the MPI backend (DDP_BACKEND=mpi) to share GPUs.";
  }
  if (use_cuda && error.empty()) {
    const int ordinal = options.cuda_device >= 0 ? options.cuda_device : local_rank_ % gpus;
    const cudaError_t status = cudaSetDevice(ordinal);
    if (status != cudaSuccess) {
      error = "cudaSetDevice(" + std::to_string(ordinal) + ") failed: " + detail::cuda_error_string(status);
    } else {
      device_ = Device::cuda(ordinal);
    }
  }
  agree(error, "device binding failed");
}

void World::create_nccl() const {
  std::string nccl_error;
  try {
    nccl_ = NcclCommunicator::create(mpi_->comm, device_, nccl_init_timeout_s_);
  } catch (const std::exception& e) {
    nccl_error = e.what();
  }
  agree(nccl_error, "NCCL communicator creation failed");
}

World::~World() {
  // Unwound by an exception that this rank alone may have raised: MPI_Finalize would wait for ranks that are
  // still training (and they for us, in their next collective), so MPI stays up for run_main to report the
  // error and MPI_Abort the job. An error all ranks agreed on is finalised there too.
  if (std::uncaught_exceptions() > uncaught_at_start_) return;
  nccl_.reset();
  side_channel_.reset();
  stop_collective_mismatch();
  if (mpi_->comm != MPI_COMM_NULL && mpi_is_running()) MPI_Comm_free(&mpi_->comm);
  if (owns_mpi_ && mpi_is_running()) MPI_Finalize();
}

double World::sum(double value) const {
  sum_in_place(&value, 1);
  return value;
}

void World::sum_in_place(double* values, int count) const {
  run_host_collective("World::sum", count, DType::kFloat64, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, mpi_->comm, request);
  });
}

double World::max(double value) const {
  run_host_collective("World::max", 1, DType::kFloat64, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, mpi_->comm, request);
  });
  return value;
}

void World::agree(const std::string& local_error, const std::string& what, AgreedError kind) const {
  const MPI_Comm comm = mpi_->comm;
  int failed = local_error.empty() ? 0 : 1;
  int any_failed = 0;
  run_host_collective("World::agree", 1, DType::kInt32, [&](MPI_Request* request) {
    return MPI_Iallreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, comm, request);
  });
  if (!any_failed) return;

  // Gather every rank's message so the report names each failing rank, not only ours.
  const int length = static_cast<int>(local_error.size());
  std::vector<int> lengths(size_);
  run_host_collective("World::agree", size_, DType::kInt32, [&](MPI_Request* request) {
    return MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm, request);
  });
  std::vector<int> offsets(size_, 0);
  for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(offsets[size_ - 1] + lengths[size_ - 1], '\0');
  run_host_collective("World::agree", static_cast<std::int64_t>(all.size()), DType::kUInt8, [&](MPI_Request* request) {
    return MPI_Iallgatherv(local_error.data(), length, MPI_CHAR, &all[0], lengths.data(), offsets.data(), MPI_CHAR,
                           comm, request);
  });
  // Ranks that failed the same way share one line: "ranks 0,1,2,3: ...".
  std::vector<std::pair<std::string, std::string>> groups;  // (ranks, message)
  for (int r = 0; r < size_; ++r) {
    if (lengths[r] == 0) continue;
    const std::string text = all.substr(offsets[r], lengths[r]);
    auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.second == text; });
    if (same == groups.end()) {
      groups.emplace_back(std::to_string(r), text);
    } else {
      same->first += "," + std::to_string(r);
    }
  }
  std::string message = what + ":";
  for (const auto& [ranks, text] : groups) {
    message += std::string("\n  rank") + (ranks.find(',') == std::string::npos ? " " : "s ") + ranks + ": " + text;
  }
  throw CollectiveError(message, rank_, kind);
}

namespace {

// FNV-1a over the text: the same settings give the same digest on every rank.
std::uint64_t digest(const std::string& text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// "0", "0,2,3"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

void World::agree_same(const std::vector<std::pair<std::string, std::string>>& settings,
                       const std::string& what) const {
  std::map<std::string, std::string> mine(settings.begin(), settings.end());
  std::string text;  // "name\0value\0" in name order
  for (const auto& [name, value] : mine) text += name + '\0' + value + '\0';
  std::uint64_t local = digest(text);
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(size_));
  run_host_collective("World::agree_same", size_, DType::kInt64, [&](MPI_Request* request) {
    return MPI_Iallgather(&local, 1, MPI_UINT64_T, digests.data(), 1, MPI_UINT64_T, mpi_->comm, request);
  });
  if (std::all_of(digests.begin(), digests.end(), [&](std::uint64_t d) { return d == digests[0]; })) return;

  // They differ: every rank gathers every rank's settings and names the differences, the same on every rank.
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  run_host_collective("World::agree_same", size_, DType::kInt32, [&](MPI_Request* request) {
    return MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, mpi_->comm, request);
  });
  std::vector<int> offsets(static_cast<std::size_t>(size_), 0);
  for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets[size_ - 1] + lengths[size_ - 1]), '\0');
  run_host_collective("World::agree_same", static_cast<std::int64_t>(all.size()), DType::kUInt8,
                      [&](MPI_Request* request) {
                        return MPI_Iallgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                               offsets.data(), MPI_CHAR, mpi_->comm, request);
                      });
  std::vector<std::map<std::string, std::string>> of_rank(static_cast<std::size_t>(size_));
  std::set<std::string> names;
  for (int r = 0; r < size_; ++r) {
    const std::string part = all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r]));
    for (std::size_t at = 0; at < part.size();) {
      const std::size_t name_end = part.find('\0', at);
      const std::size_t value_end = part.find('\0', name_end + 1);
      if (name_end == std::string::npos || value_end == std::string::npos) break;
      of_rank[r][part.substr(at, name_end - at)] = part.substr(name_end + 1, value_end - name_end - 1);
      names.insert(part.substr(at, name_end - at));
      at = value_end + 1;
    }
  }
  std::string message = what + ":";
  for (const std::string& name : names) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;  // value -> ranks, in order of first rank
    for (int r = 0; r < size_; ++r) {
      const auto it = of_rank[r].find(name);
      const std::string value = it == of_rank[r].end() ? "(not given)" : it->second.empty() ? "given" : it->second;
      auto same = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == value; });
      if (same == groups.end()) {
        groups.push_back({value, {r}});
      } else {
        same->second.push_back(r);
      }
    }
    if (groups.size() < 2) continue;
    // The values of the fewest ranks first: those are most likely the ones started wrong.
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    message += "\n  " + name + ":";
    for (std::size_t g = 0; g < groups.size(); ++g) {
      message += std::string(g ? "," : "") + " " + groups[g].first + " on rank" +
                 (groups[g].second.size() > 1 ? "s " : " ") + rank_list(groups[g].second);
    }
  }
  message += "\nStart every rank with the same settings (ddprun passes the same command line to every rank).";
  throw CollectiveError(message, rank_);
}

void World::abort(const std::string& message, int exit_code) const {
  std::fprintf(stderr, "rank %d: fatal: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int agreed_error_exit_status(const CollectiveError& e) {
  if (stopping()) return kStopFailedExitStatus;
  return e.kind() == AgreedError::kInput ? kInputErrorExitStatus : 1;
}

int run_main(const std::function<int()>& body) {
  // A write past a file-size limit (ulimit -f) then fails with EFBIG, which the writer reports by name, instead
  // of SIGXFSZ killing the rank without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return body();
  } catch (const CollectiveError& e) {
    // Every rank is here with the same message: rank 0 reports it and all end cleanly.
    if (e.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(stderr);
    if (mpi_is_running()) MPI_Finalize();
    // Rank 0 alone ends with the failure's status (a stop that failed on the way is still a stop: ddprun must
    // not restart it), so that the job's status is the error's. The others end with 0: mpirun ends the whole
    // job at a rank's first non-zero status, and rank 0, ended before mpirun had relayed its message, would
    // lose it; a rank's own output is relayed whole before its status is taken.
    return e.rank() == 0 ? agreed_error_exit_status(e) : 0;
  } catch (const std::exception& e) {
    int rank = 0;
    int size = 1;
    if (mpi_is_running()) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    // The other ranks may be inside a collective waiting for us: end them too.
    const int status = stopping() ? kStopFailedExitStatus : 1;
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, status);
    return status;
  }
}

}  // namespace ddp
