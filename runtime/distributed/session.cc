// Session: the World, the default stream, the backend choice and the process group, in the order a program
// needs them.
#include "runtime/distributed/session.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/world.h"
#include "runtime/kernels/cpu/threads.h"

namespace ddp {
namespace {

// The backend the option, or else DDP_BACKEND, names; nullopt for the default of the device. An unknown name
// goes to `error` (reported by every rank together once the world exists) and counts as the default.
std::optional<Backend> requested_backend(const std::string& option, std::string* error) {
  try {
    std::string text = option;
    if (text.empty() || text == "auto") text = settings::text(settings::setting("DDP_BACKEND"));
    if (text == "auto") return std::nullopt;
    return parse_backend(text);
  } catch (const InvalidArgument& e) {
    *error = (option.empty() || option == "auto" ? "" : "backend: ") + std::string(e.what());
    return std::nullopt;
  }
}

WorldOptions world_options(const SessionOptions& options) {
  WorldOptions w;
  w.device = options.device;
  std::string unknown;  // reported by the constructor, on every rank together
  const std::optional<Backend> backend = requested_backend(options.backend, &unknown);
  // Without NCCL several ranks may share one GPU (the MPI backend); with it the world needs a GPU per rank. An
  // unknown name makes no communicator, so that the error said is that name (not a GPU shared by ranks).
  w.nccl = options.process_group && unknown.empty() && (!backend || *backend == Backend::kNccl);
  w.nccl_init_timeout_s = options.nccl_init_timeout_s;
  w.cuda_device = options.cuda_device;
  return w;
}

}  // namespace

Session::Session(int* argc, char*** argv, SessionOptions options)
    : world_(std::make_unique<World>(argc, argv, world_options(options))), wants_group_(options.process_group) {
  start(options);
}

Session::Session(ApplicationCommunicator comm, SessionOptions options)
    : world_(std::make_unique<World>(comm, world_options(options))), wants_group_(options.process_group) {
  start(options);
}

void Session::start(const SessionOptions& options) {
  rank_ = world_->rank();
  size_ = world_->size();
  std::string error;
  const std::optional<Backend> requested = requested_backend(options.backend, &error);
  backend_ = requested.value_or(device().is_cuda() ? Backend::kNccl : Backend::kMpi);
  if (error.empty() && wants_group_ && backend_ == Backend::kNccl && !device().is_cuda()) {
    error = "the NCCL backend needs CUDA devices, but this rank runs on " + device().str() +
            " (use the MPI backend: SessionOptions::backend \"mpi\" or DDP_BACKEND=mpi; or ask for the GPU: " +
            "SessionOptions::device kCuda)";
  }
  world_->agree(error, "bad backend");

  if (options.cuda_stream != nullptr && !device().is_cuda()) {
    error = "an application's CUDA stream was given, but this rank runs on " + device().str() +
            ": pass no stream on the CPU";
  }
  world_->agree(error, "bad stream");
  stream_ = options.cuda_stream != nullptr ? Stream::borrow(device(), static_cast<StreamHandle>(options.cuda_stream))
                                           : Stream::create(device());
  current_ = std::make_unique<StreamGuard>(stream_);
  if (device().is_cpu()) {
    cpu_threads_ = options.cpu_threads;
    // A thread count the environment gives OpenBLAS (or OpenMP) is the user's choice and wins over the default.
    for (const char* name : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
      const char* value = std::getenv(name);
      if (cpu_threads_ <= 0 && value != nullptr) cpu_threads_ = std::atoi(value);
    }
    if (cpu_threads_ <= 0) {
      const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
      cpu_threads_ = std::max(1, cores / std::max(1, local_size()));
    }
    kernels::cpu::set_threads(cpu_threads_);
  }
}

Session::~Session() = default;

ProcessGroup& Session::group() {
  if (group_ == nullptr) {
    DDP_CHECK(wants_group_, "this Session was made with SessionOptions::process_group = false, so it has no "
                            "process group: leave the option at true to communicate gradients");
    group_ = make_process_group(*world_, device(), backend_);
  }
  return *group_;
}

int Session::local_rank() const { return world_->local_rank(); }
int Session::local_size() const { return world_->local_size(); }
const Device& Session::device() const { return world_->device(); }
double Session::sum(double value) const { return world_->sum(value); }
double Session::max(double value) const { return world_->max(value); }
bool Session::any(bool flag) const { return world_->any(flag); }
void Session::agree(const std::string& local_error, const std::string& what, AgreedError kind) const {
  world_->agree(local_error, what, kind);
}
void Session::agree_same(const std::vector<std::pair<std::string, std::string>>& settings,
                         const std::string& what) const {
  world_->agree_same(settings, what);
}

bool Session::stop_requested() const {
  const bool any = world_->any(ddp::stop_requested());
  if (any) ddp::note_stopping();
  return any;
}

std::vector<double> Session::sum(std::vector<double> values) const {
  world_->sum_in_place(values.data(), static_cast<int>(values.size()));
  return values;
}

std::vector<std::pair<std::string, std::string>> command_line_settings(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> settings;
  int positional = 0;
  auto is_flag = [](const std::string& a) { return a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9'); };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!is_flag(arg)) {
      settings.emplace_back("argument " + std::to_string(++positional), arg);
      continue;
    }
    const std::size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      settings.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
    } else if (i + 1 < argc && !is_flag(argv[i + 1])) {
      settings.emplace_back(arg, argv[++i]);
    } else {
      settings.emplace_back(arg, "");
    }
  }
  return settings;
}

}  // namespace ddp
