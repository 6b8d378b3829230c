// The C API (ddp_c.h) over the C++ runtime: each call checks its arguments and handles, runs the C++ call inside
// one catch-all, and turns whatever was thrown into a status code and this thread's last message, so that no
// exception ever reaches a C or Fortran caller.
#include "capi/ddp_c.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp.h"
#include "ddp_mpi.h"
#include "runtime/core/settings.h"
#include "runtime/data/replay_buffer.h"
#include "runtime/io/checkpoint.h"
#include "runtime/models/fused_mlp_mse.h"
#include "runtime/models/model_description.h"
#include "runtime/training/train_step.h"
#include "runtime/training/training_checkpoint.h"
#include "runtime/training/weights_file.h"

struct ddp_session {
  std::unique_ptr<ddp::Session> session;
  int models = 0;
  int buffers = 0;
};

struct ddp_model {
  ddp_session* owner = nullptr;
  std::shared_ptr<ddp::Module> module;  // an MLP (ddp_mlp_create) or any model of the runtime's layers
  std::unique_ptr<ddp::DistributedDataParallel> data_parallel;
  std::int64_t in = 0;
  std::int64_t out = 0;
  std::string architecture;  // what a checkpoint records, and what a checkpoint to load must match
  int optimizers = 0;
  ddp::data::NonFinitePolicy nonfinite = ddp::data::NonFinitePolicy::kRefuse;  // of ddp_train_step's samples
  std::int64_t nonfinite_skipped = 0;
  // The step's forward, loss and backward in one pass, for a narrow MLP on a GPU (fused_pass_of).
  std::unique_ptr<ddp::FusedMlpMse> fused;
};

struct ddp_optimizer {
  ddp_model* owner = nullptr;
  std::unique_ptr<ddp::Optimizer> optimizer;
  // The training step with this optimizer (made at the first step): eager at first, then on a GPU over NCCL one
  // captured CUDA graph replayed each step. Made again if the model is distributed after it.
  std::unique_ptr<ddp::TrainStep> step;
  bool step_distributed = false;
};

struct ddp_replay_buffer {
  ddp_session* owner = nullptr;
  std::unique_ptr<ddp::data::ReplayBuffer> buffer;
  std::uint64_t key = 0;    // the seed with the rank mixed in
  std::uint64_t draws = 0;
};

namespace {

thread_local std::string t_last_error;

// Every handle made here, live or destroyed, with its kind and the thread that made it, so that a destroyed,
// foreign or borrowed pointer is refused instead of dereferenced. A destroyed handle frees what it holds but
// keeps its own few bytes, so no later handle can land at its address: a stale pointer stays recognisably
// destroyed (had the memory been freed, the allocator could give it to the next handle of the same kind, which
// the stale pointer would then reach).
enum class Kind { kSession, kModel, kOptimizer, kReplayBuffer };

struct Entry {
  Kind kind;
  bool live;
  std::thread::id thread;  // the runtime's state (streams, the CUDA device, MPI's ordering) is per thread
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, Entry> handles;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: calls may come during static destruction
  return *r;
}

void add(const void* handle, Kind kind) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().handles[handle] = Entry{kind, true, std::this_thread::get_id()};
}

// Frees what `handle` holds (its members in the order its destructor takes) and marks it destroyed; its memory
// is kept, as the registry's note says.
template <typename Handle>
void retire(Handle* handle) {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().handles.at(handle).live = false;
  }
  std::destroy_at(handle);
  std::construct_at(handle);
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kSession: return "ddp_session";
    case Kind::kModel: return "ddp_model";
    case Kind::kOptimizer: return "ddp_optimizer";
    case Kind::kReplayBuffer: return "ddp_replay_buffer";
  }
  return "handle";
}

// The checkpoint's metadata key for the model's architecture (ddp_model::architecture).
constexpr const char* kArchitectureKey = "capi.architecture";

// A failure to report: its code and message.
struct Failure {
  int status;
  std::string message;
};

void check_handle(const void* handle, Kind kind, const char* argument) {
  if (handle == nullptr) {
    throw Failure{DDP_ERROR_INVALID_HANDLE, std::string(argument) + " is NULL: pass a " + kind_name(kind) +
                                                " made by its create call"};
  }
  std::lock_guard<std::mutex> lock(registry().mutex);
  const auto it = registry().handles.find(handle);
  if (it == registry().handles.end()) {
    throw Failure{DDP_ERROR_INVALID_HANDLE, std::string(argument) + " is not a " + kind_name(kind) +
                                                " made by this library: pass the handle its create call gave"};
  }
  const Entry& entry = it->second;
  if (entry.kind != kind) {
    throw Failure{DDP_ERROR_INVALID_HANDLE, std::string(argument) + " is a " + kind_name(entry.kind) + ", not a " +
                                                kind_name(kind)};
  }
  if (!entry.live) {
    throw Failure{DDP_ERROR_INVALID_HANDLE, std::string(argument) + " was destroyed already: make a new " +
                                                kind_name(kind) + " (a destroyed handle is refused for good)"};
  }
  if (entry.thread != std::this_thread::get_id()) {
    throw Failure{DDP_ERROR_INVALID_HANDLE,
                  std::string(argument) + " belongs to the thread that created it, and this is another: make every "
                                          "call on a handle (and on its session's models, optimizers and buffers) "
                                          "from the thread that created the session"};
  }
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Failure{DDP_ERROR_INVALID_ARGUMENT, message};
}
// The same, the message made only when the condition fails: for the checks every step makes.
template <typename Message>
  requires std::is_invocable_r_v<std::string, Message>
void require(bool condition, const Message& message) {
  if (!condition) throw Failure{DDP_ERROR_INVALID_ARGUMENT, message()};
}

// MPI must be running for any call that may communicate or free communicators.
void require_mpi(const char* call) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw Failure{DDP_ERROR_MPI, std::string(call) + " after MPI_Finalize: destroy optimizers, models and sessions "
                                                     "before the application finalises MPI"};
  }
  if (!initialized) {
    throw Failure{DDP_ERROR_MPI, std::string(call) + " before MPI_Init_thread: the application initialises MPI "
                                                     "(MPI_Init_thread with MPI_THREAD_MULTIPLE) first"};
  }
}

// cudaErrorMemoryAllocation, without the CUDA headers here.
constexpr int kCudaOutOfMemory = 2;

int status_of(const ddp::Error& e) {
  if (dynamic_cast<const ddp::CollectiveError*>(&e) != nullptr) return DDP_ERROR_COLLECTIVE;
  if (dynamic_cast<const ddp::InvalidArgument*>(&e) != nullptr) return DDP_ERROR_INVALID_ARGUMENT;
  if (dynamic_cast<const ddp::InternalError*>(&e) != nullptr) return DDP_ERROR_INTERNAL;
  if (dynamic_cast<const ddp::OutOfMemory*>(&e) != nullptr) return DDP_ERROR_OUT_OF_MEMORY;
  const auto* cuda = dynamic_cast<const ddp::CudaError*>(&e);
  if (cuda != nullptr && cuda->code() == kCudaOutOfMemory) return DDP_ERROR_OUT_OF_MEMORY;
  return std::strstr(e.what(), "MPI") != nullptr ? DDP_ERROR_MPI : DDP_ERROR_RUNTIME;
}

// Runs `body`, mapping anything it throws to a status and this thread's message.
template <typename Body>
int guarded(const char* call, Body&& body) {
  try {
    body();
    t_last_error.clear();
    return DDP_OK;
  } catch (const Failure& f) {
    t_last_error = std::string(call) + ": " + f.message;
    return f.status;
  } catch (const ddp::Error& e) {
    // The user's half of the message: the runtime's source locations and check text are for its developers.
    t_last_error = std::string(call) + ": " + e.user_message();
    return status_of(e);
  } catch (const std::bad_alloc&) {
    t_last_error = std::string(call) + ": out of memory: ask for less (a smaller batch, buffer or model)";
    return DDP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    t_last_error = std::string(call) + ": " + e.what();
    return DDP_ERROR_RUNTIME;
  } catch (...) {
    t_last_error = std::string(call) + ": an unknown exception";
    return DDP_ERROR_INTERNAL;
  }
}

ddp::DeviceRequest device_of(const char* device) {
  if (device == nullptr) return ddp::DeviceRequest::kAuto;
  return ddp::parse_device_request(device);
}

int create_session(const char* call, ddp::ApplicationCommunicator comm, ddp::SessionOptions options,
                   ddp_session** out) {
  return guarded(call, [&] {
    require(out != nullptr, "out is NULL: pass the address of a ddp_session* to receive the session");
    *out = nullptr;
    require_mpi(call);
    auto s = std::make_unique<ddp_session>();
    s->session = std::make_unique<ddp::Session>(comm, options);
    *out = s.release();
    add(*out, Kind::kSession);
  });
}

// The communicator's Fortran handle, without calling MPI when it is not running (create_session refuses then).
ddp::ApplicationCommunicator handle_of(MPI_Comm comm) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized ? ddp::communicator(comm) : ddp::ApplicationCommunicator{};
}

// A tensor over the caller's array where it is: host memory, or the session's GPU.
ddp::Tensor caller_array(const float* data, std::int64_t rows, std::int64_t cols, int memory,
                         const ddp::Session& session) {
  const ddp::Device where = memory == DDP_MEMORY_DEVICE ? session.device() : ddp::Device::cpu();
  return ddp::Tensor::from_blob(const_cast<float*>(data), {rows, cols}, ddp::DType::kFloat32, where);
}

// `t` on the session's device: itself when it is there (in place), else a copy.
ddp::Tensor on_device(const ddp::Tensor& t, const ddp::Session& session) {
  return t.device() == session.device() ? t : t.copy_to(session.device(), session.stream());
}

ddp::data::NonFinitePolicy nonfinite_policy(int policy) {
  require(policy == DDP_NONFINITE_REFUSE || policy == DDP_NONFINITE_SKIP,
          "policy is " + std::to_string(policy) + ": pass DDP_NONFINITE_REFUSE (0) or DDP_NONFINITE_SKIP (1)");
  return policy == DDP_NONFINITE_SKIP ? ddp::data::NonFinitePolicy::kSkip : ddp::data::NonFinitePolicy::kRefuse;
}

// x (rows x `in`) and y (rows x `out`) in `memory`, for `owner` ("the model", "the buffer") of a session on `session`.
void check_arrays(const char* owner, std::int64_t in_width, std::int64_t out_width, const ddp::Session& session,
                  const void* x, std::int64_t x_rows, std::int64_t x_cols, const void* y, std::int64_t y_rows,
                  std::int64_t y_cols, int memory) {
  const auto in = [&] { return std::to_string(in_width); };
  const auto out = [&] { return std::to_string(out_width); };
  require(x != nullptr, [&] { return "x is NULL: pass the inputs, rows x " + in() + " float32 values"; });
  require(y != nullptr, [&] { return "y is NULL: pass rows x " + out() + " float32 values"; });
  require(x_rows > 0,
          [&] { return "x_rows is " + std::to_string(x_rows) + ": pass the number of samples (at least 1)"; });
  require(x_cols == in_width, [&] {
    return "x_cols is " + std::to_string(x_cols) + ", but " + owner + " takes " + in() +
           " inputs: pass arrays of rows x " + in() + " (in Fortran, x(" + in() + ", rows))";
  });
  require(y_cols == out_width, [&] {
    return "y_cols is " + std::to_string(y_cols) + ", but " + owner + " has " + out() +
           " outputs: pass arrays of rows x " + out() + " (in Fortran, y(" + out() + ", rows))";
  });
  require(y_rows == x_rows, [&] {
    return "y_rows is " + std::to_string(y_rows) + " but x_rows is " + std::to_string(x_rows) +
           ": x and y hold the same samples, one row each";
  });
  require(memory == DDP_MEMORY_HOST || memory == DDP_MEMORY_DEVICE, [&] {
    return "memory is " + std::to_string(memory) + ": pass DDP_MEMORY_HOST (0) or DDP_MEMORY_DEVICE (1)";
  });
  require(memory == DDP_MEMORY_HOST || session.device().is_cuda(),
          "DDP_MEMORY_DEVICE was passed, but the session runs on the CPU: pass DDP_MEMORY_HOST");
}

void check_arrays(const ddp_model* m, const void* x, std::int64_t x_rows, std::int64_t x_cols, const void* y,
                  std::int64_t y_rows, std::int64_t y_cols, int memory) {
  check_arrays("the model", m->in, m->out, *m->owner->session, x, x_rows, x_cols, y, y_rows, y_cols, memory);
}

// The model and optimizer of a step: live, and made for each other.
void check_step_handles(const ddp_model* model, const ddp_optimizer* optimizer) {
  check_handle(model, Kind::kModel, "model");
  check_handle(optimizer, Kind::kOptimizer, "optimizer");
  require(optimizer->owner == model, "the optimizer was made for another model: pass the model it updates");
}

// The fused pass for `model`'s step where it applies: a narrow MLP (FusedMlpMse::unfit_reason) on a GPU, unless
// DDP_FUSED_MLP=0.
std::unique_ptr<ddp::FusedMlpMse> fused_pass_of(ddp_model& model) {
  auto* mlp = dynamic_cast<ddp::MLP*>(model.module.get());
  if (mlp == nullptr || !model.owner->session->device().is_cuda() ||
      !ddp::settings::flag(ddp::settings::setting("DDP_FUSED_MLP")) || !ddp::FusedMlpMse::unfit_reason(*mlp).empty()) {
    return nullptr;
  }
  return std::make_unique<ddp::FusedMlpMse>(*mlp);
}

// The optimizer's training step: mean-squared-error regression of the model, data-parallel when the model is.
ddp::TrainStep& train_step_of(ddp_model* model, ddp_optimizer* optimizer) {
  const bool distributed = model->data_parallel != nullptr;
  if (optimizer->step == nullptr || optimizer->step_distributed != distributed) {
    ddp::TrainStepOptions options;
    options.cuda_graph = ddp::settings::flag(ddp::settings::setting("DDP_CUDA_GRAPH"));
    // A model that is not distributed steps on each rank alone, as often as that rank likes.
    options.ranks_step_together = distributed;
    // Checked on the device as the step copies them in (the ranks of a distributed model agree there too).
    options.refuse_nonfinite_samples = true;
    // The one option a C program can set is the environment's.
    options.option_name = [](const std::string& option, const std::string& value) {
      if (option == "cuda_graph") return std::string("DDP_CUDA_GRAPH=") + (value == "false" ? "0" : "1");
      return "the C API's " + option;
    };
    options.say = [](const std::string&) {};  // a library inside an application prints nothing of its own
    model->fused = fused_pass_of(*model);
    options.zero_grad = model->fused == nullptr;  // the fused pass writes every gradient
    optimizer->step = std::make_unique<ddp::TrainStep>(
        *model->owner->session, *optimizer->optimizer,
        [model](const ddp::Tensor& x, const ddp::Tensor& y) {
          const ddp::Stream& stream = model->owner->session->stream();
          if (model->fused != nullptr) {
            ddp::Tensor l = (*model->fused)(x, y, stream);
            if (model->data_parallel != nullptr) model->data_parallel->reduce_gradients();
            return l;
          }
          ddp::Tensor l = ddp::ops::mse_loss(model->module->forward(x, stream), y, stream);
          if (model->data_parallel != nullptr) {
            model->data_parallel->backward(l);
          } else {
            ddp::autograd::backward(l, stream);
          }
          return l;
        },
        options);
    optimizer->step_distributed = distributed;
  }
  return *optimizer->step;
}

// After the session's stream has been waited for: what the steps of its optimizers refused since their last wait
// (an asynchronous step's batch, checked on the device) is thrown.
void settle_steps(const ddp_session* session) {
  std::vector<ddp_optimizer*> optimizers;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    for (const auto& [handle, entry] : registry().handles) {
      if (entry.kind != Kind::kOptimizer || !entry.live) continue;
      auto* o = static_cast<ddp_optimizer*>(const_cast<void*>(handle));
      if (o->step != nullptr && o->owner->owner == session) optimizers.push_back(o);
    }
  }
  for (ddp_optimizer* o : optimizers) o->step->synchronize();
}

// How a step ends for the caller: kSynchronous completes it before returning (the loss read when asked);
// kAsynchronous returns once it is enqueued on the session's stream.
enum class Completion { kSynchronous, kAsynchronous };

// A step `step` has queued, as `completion` asks: its loss read (when asked) or its end waited for.
void finish(ddp::TrainStep& step, const ddp::StepResult& result, Completion completion, double* loss) {
  if (completion == Completion::kAsynchronous) return;
  if (loss != nullptr) {
    *loss = result.loss;
  } else {
    step.synchronize();
  }
}

// One step on tensors of the session's device. The step's buffers take a copy of them, so once the copy has run
// (at once for host memory; in stream order for device arrays) the caller may overwrite its arrays.
void train_on(ddp_model* model, ddp_optimizer* optimizer, const ddp::Tensor& inputs, const ddp::Tensor& targets,
              Completion completion, double* loss) {
  ddp::TrainStep& step = train_step_of(model, optimizer);
  const bool read = completion == Completion::kSynchronous && loss != nullptr;
  finish(step, step(inputs, targets, read), completion, loss);
}

int create_optimizer(const char* call, ddp_model* model, ddp_optimizer** out,
                     const std::function<std::unique_ptr<ddp::Optimizer>(ddp_model&)>& make) {
  return guarded(call, [&] {
    require(out != nullptr, "out is NULL: pass the address of a ddp_optimizer* to receive the optimizer");
    *out = nullptr;
    check_handle(model, Kind::kModel, "model");
    auto o = std::make_unique<ddp_optimizer>();
    o->owner = model;
    o->optimizer = make(*model);
    *out = o.release();
    ++model->optimizers;
    add(*out, Kind::kOptimizer);
  });
}

void train_step_on_arrays(ddp_model* model, ddp_optimizer* optimizer, const float* x, int64_t x_rows, int64_t x_cols,
                          const float* y, int64_t y_rows, int64_t y_cols, int memory, Completion completion,
                          double* loss) {
  check_step_handles(model, optimizer);
  check_arrays(model, x, x_rows, x_cols, y, y_rows, y_cols, memory);
  if (model->data_parallel != nullptr) require_mpi(completion == Completion::kSynchronous ? "ddp_train_step"
                                                                                          : "ddp_train_step_async");
  const ddp::Session& s = *model->owner->session;
  if (model->nonfinite == ddp::data::NonFinitePolicy::kRefuse) {
    // The step refuses them itself, checking on the device without waiting (an asynchronous step's refusal
    // comes at the next wait).
    train_on(model, optimizer, on_device(caller_array(x, x_rows, x_cols, memory, s), s),
             on_device(caller_array(y, y_rows, y_cols, memory, s), s), completion, loss);
    return;
  }
  // Checked where the caller's arrays are, before any copy.
  const ddp::data::FiniteSamples finite = ddp::data::finite_samples(
      caller_array(x, x_rows, x_cols, memory, s), caller_array(y, y_rows, y_cols, memory, s), model->nonfinite,
      s.stream());
  model->nonfinite_skipped += finite.skipped;
  if (finite.x.size(0) > 0) {
    train_on(model, optimizer, on_device(finite.x, s), on_device(finite.y, s), completion, loss);
  } else if (model->data_parallel != nullptr) {
    // Every sample skipped, but the other ranks step and average with this one: it adds a gradient of zero,
    // from one sample of zeros whose target is the model's own output for it (the loss is then exactly 0).
    const ddp::Tensor zeros = ddp::Tensor::zeros({1, model->in}, ddp::DType::kFloat32, s.device(), s.stream());
    ddp::Tensor target;
    {
      ddp::autograd::NoGradGuard no_grad;
      target = model->module->forward(zeros, s.stream());
    }
    train_on(model, optimizer, zeros, target, completion, loss);
  } else if (loss != nullptr) {
    *loss = 0;  // no step taken
  }
}

}  // namespace

extern "C" {

const char* ddp_last_error(void) { return t_last_error.c_str(); }

void ddp_last_error_copy(char* buffer, int64_t size) {
  if (buffer == nullptr || size <= 0) return;
  const std::size_t n = std::min<std::size_t>(t_last_error.size(), static_cast<std::size_t>(size - 1));
  std::memcpy(buffer, t_last_error.data(), n);
  buffer[n] = '\0';
}

const char* ddp_status_name(int status) {
  switch (status) {
    case DDP_OK: return "DDP_OK";
    case DDP_ERROR_INVALID_ARGUMENT: return "DDP_ERROR_INVALID_ARGUMENT";
    case DDP_ERROR_INVALID_HANDLE: return "DDP_ERROR_INVALID_HANDLE";
    case DDP_ERROR_MPI: return "DDP_ERROR_MPI";
    case DDP_ERROR_COLLECTIVE: return "DDP_ERROR_COLLECTIVE";
    case DDP_ERROR_OUT_OF_MEMORY: return "DDP_ERROR_OUT_OF_MEMORY";
    case DDP_ERROR_RUNTIME: return "DDP_ERROR_RUNTIME";
    case DDP_ERROR_INTERNAL: return "DDP_ERROR_INTERNAL";
    default: return "unknown status";
  }
}

int ddp_session_create(MPI_Comm comm, const char* device, ddp_session** out) {
  ddp::SessionOptions options;
  const int status = guarded("ddp_session_create", [&] { options.device = device_of(device); });
  if (status != DDP_OK) return status;
  return create_session("ddp_session_create", handle_of(comm), options, out);
}

int ddp_session_create_f(MPI_Fint comm, const char* device, ddp_session** out) {
  ddp::SessionOptions options;
  const int status = guarded("ddp_session_create_f", [&] { options.device = device_of(device); });
  if (status != DDP_OK) return status;
  return create_session("ddp_session_create_f", ddp::ApplicationCommunicator{comm}, options, out);
}

int ddp_session_create_cuda(MPI_Comm comm, int cuda_device, void* cuda_stream, ddp_session** out) {
  ddp::SessionOptions options;
  options.device = ddp::DeviceRequest::kCuda;
  options.cuda_device = cuda_device;
  options.cuda_stream = cuda_stream;
  return create_session("ddp_session_create_cuda", handle_of(comm), options, out);
}

int ddp_session_rank(const ddp_session* session, int* rank) {
  return guarded("ddp_session_rank", [&] {
    check_handle(session, Kind::kSession, "session");
    require(rank != nullptr, "rank is NULL: pass the address of an int");
    *rank = session->session->rank();
  });
}

int ddp_session_size(const ddp_session* session, int* size) {
  return guarded("ddp_session_size", [&] {
    check_handle(session, Kind::kSession, "session");
    require(size != nullptr, "size is NULL: pass the address of an int");
    *size = session->session->size();
  });
}

int ddp_session_on_gpu(const ddp_session* session, int* on_gpu) {
  return guarded("ddp_session_on_gpu", [&] {
    check_handle(session, Kind::kSession, "session");
    require(on_gpu != nullptr, "on_gpu is NULL: pass the address of an int");
    *on_gpu = session->session->device().is_cuda() ? 1 : 0;
  });
}

int ddp_session_cuda_stream(const ddp_session* session, void** stream) {
  return guarded("ddp_session_cuda_stream", [&] {
    check_handle(session, Kind::kSession, "session");
    require(stream != nullptr, "stream is NULL: pass the address of a void* (a cudaStream_t)");
    *stream = static_cast<void*>(session->session->stream().handle());
  });
}

int ddp_session_mean(const ddp_session* session, double value, double* mean) {
  return guarded("ddp_session_mean", [&] {
    check_handle(session, Kind::kSession, "session");
    require(mean != nullptr, "mean is NULL: pass the address of a double");
    require_mpi("ddp_session_mean");
    *mean = session->session->mean(value);
  });
}

int ddp_session_synchronize(const ddp_session* session) {
  return guarded("ddp_session_synchronize", [&] {
    check_handle(session, Kind::kSession, "session");
    session->session->stream().synchronize();
    settle_steps(session);
  });
}

int ddp_session_record_event(const ddp_session* session, void* cuda_event) {
  return guarded("ddp_session_record_event", [&] {
    check_handle(session, Kind::kSession, "session");
    require(cuda_event != nullptr, "cuda_event is NULL: pass a cudaEvent_t made with cudaEventCreate");
    require(session->session->device().is_cuda(),
            "the session runs on the CPU, where every call completes before it returns: no event is needed");
    session->session->stream().record_foreign_event(cuda_event);
  });
}

int ddp_session_destroy(ddp_session* session) {
  return guarded("ddp_session_destroy", [&] {
    check_handle(session, Kind::kSession, "session");
    require(session->models == 0 && session->buffers == 0,
            std::to_string(session->models) + " model(s) and " + std::to_string(session->buffers) +
                " replay buffer(s) of this session still exist: destroy them first");
    // After MPI_Finalize its communicators cannot be freed: the session is left allocated and stays live, so
    // that the call is refused again rather than crashing.
    require_mpi("ddp_session_destroy");
    retire(session);
  });
}

int ddp_mlp_create(ddp_session* session, int count, const int64_t* sizes, const char* activation, uint64_t seed,
                   ddp_model** out) {
  return guarded("ddp_mlp_create", [&] {
    require(out != nullptr, "out is NULL: pass the address of a ddp_model* to receive the model");
    *out = nullptr;
    check_handle(session, Kind::kSession, "session");
    require(sizes != nullptr, "sizes is NULL: pass the layer widths, inputs first and outputs last");
    require(count >= 2, "count is " + std::to_string(count) + ": an MLP needs at least 2 sizes (inputs, outputs)");
    std::vector<std::int64_t> widths(sizes, sizes + count);
    for (int i = 0; i < count; ++i) {
      require(widths[i] > 0 && widths[i] <= (1 << 24),
              "sizes[" + std::to_string(i) + "] is " + std::to_string(widths[i]) + ": widths are 1 to 16777216");
    }
    const ddp::Activation act = ddp::parse_activation(activation == nullptr ? "relu" : activation);
    auto m = std::make_unique<ddp_model>();
    m->owner = session;
    m->in = widths.front();
    m->out = widths.back();
    m->architecture = "an MLP of sizes";
    for (std::size_t i = 0; i < widths.size(); ++i) {
      m->architecture += (i == 0 ? " " : "-") + std::to_string(widths[i]);
    }
    m->architecture += std::string(" with ") + ddp::activation_name(act);
    const ddp::Session& s = *session->session;
    m->module = std::make_shared<ddp::MLP>(widths, act, seed, s.device(), s.stream());
    *out = m.release();
    ++session->models;
    add(*out, Kind::kModel);
  });
}

int ddp_model_create_from_json(ddp_session* session, const char* json, uint64_t seed, ddp_model** out) {
  return guarded("ddp_model_create_from_json", [&] {
    require(out != nullptr, "out is NULL: pass the address of a ddp_model* to receive the model");
    *out = nullptr;
    check_handle(session, Kind::kSession, "session");
    require(json != nullptr, "json is NULL: pass the model's description, e.g. {\"inputs\": 5, \"layers\": "
                             "[{\"type\": \"linear\", \"out\": 1}]}");
    const ddp::Session& s = *session->session;
    ddp::DescribedModel described = ddp::build_model(json, seed, s.device(), s.stream());
    auto m = std::make_unique<ddp_model>();
    m->owner = session;
    m->in = described.inputs;
    m->out = described.outputs;
    m->architecture = "the model " + described.architecture;
    m->module = std::move(described.model);
    *out = m.release();
    ++session->models;
    add(*out, Kind::kModel);
  });
}

int ddp_model_load_weights(ddp_model* model, const char* path) {
  return guarded("ddp_model_load_weights", [&] {
    check_handle(model, Kind::kModel, "model");
    require(path != nullptr && path[0] != '\0', "path is NULL or empty: pass the safetensors file to load");
    ddp::Session& s = *model->owner->session;
    if (model->data_parallel != nullptr) {
      require_mpi("ddp_model_load_weights");
      ddp::training::load_weights(s, *model->module, path);
    } else {
      ddp::training::load_weights(*model->module, path, s.stream());
    }
  });
}

int ddp_model_save_weights(ddp_model* model, const char* path) {
  return guarded("ddp_model_save_weights", [&] {
    check_handle(model, Kind::kModel, "model");
    require(path != nullptr && path[0] != '\0', "path is NULL or empty: pass the safetensors file to write");
    ddp::Session& s = *model->owner->session;
    if (model->data_parallel != nullptr) {
      require_mpi("ddp_model_save_weights");
      ddp::training::save_weights(s, *model->module, path);
    } else {
      ddp::training::save_weights(*model->module, path, s.stream());
    }
  });
}

int ddp_model_input_size(const ddp_model* model, int64_t* size) {
  return guarded("ddp_model_input_size", [&] {
    check_handle(model, Kind::kModel, "model");
    require(size != nullptr, "size is NULL: pass the address of an int64_t");
    *size = model->in;
  });
}

int ddp_model_output_size(const ddp_model* model, int64_t* size) {
  return guarded("ddp_model_output_size", [&] {
    check_handle(model, Kind::kModel, "model");
    require(size != nullptr, "size is NULL: pass the address of an int64_t");
    *size = model->out;
  });
}

int ddp_model_distribute(ddp_model* model) {
  return guarded("ddp_model_distribute", [&] {
    check_handle(model, Kind::kModel, "model");
    require(model->data_parallel == nullptr, "the model is distributed already: call ddp_model_distribute once");
    require_mpi("ddp_model_distribute");
    model->data_parallel = std::make_unique<ddp::DistributedDataParallel>(*model->module, *model->owner->session);
  });
}

int ddp_model_destroy(ddp_model* model) {
  return guarded("ddp_model_destroy", [&] {
    check_handle(model, Kind::kModel, "model");
    require(model->optimizers == 0, std::to_string(model->optimizers) +
                                        " optimizer(s) of this model still exist: destroy them first");
    if (model->data_parallel != nullptr) require_mpi("ddp_model_destroy");
    --model->owner->models;
    retire(model);
  });
}

int ddp_optimizer_create_adamw(ddp_model* model, double lr, double weight_decay, ddp_optimizer** out) {
  return create_optimizer("ddp_optimizer_create_adamw", model, out, [&](ddp_model& m) {
    ddp::AdamWOptions options;
    options.lr = lr;
    options.weight_decay = weight_decay;
    return std::make_unique<ddp::AdamW>(*m.module, options, m.owner->session->stream());
  });
}

int ddp_optimizer_create_sgd(ddp_model* model, double lr, double momentum, ddp_optimizer** out) {
  return create_optimizer("ddp_optimizer_create_sgd", model, out, [&](ddp_model& m) {
    ddp::SgdOptions options;
    options.lr = lr;
    options.momentum = momentum;
    return std::make_unique<ddp::Sgd>(*m.module, options, m.owner->session->stream());
  });
}

int ddp_optimizer_set_lr(ddp_optimizer* optimizer, double lr) {
  return guarded("ddp_optimizer_set_lr", [&] {
    check_handle(optimizer, Kind::kOptimizer, "optimizer");
    require(lr >= 0 && lr == lr, "lr is " + std::to_string(lr) + ": pass a learning rate >= 0");
    optimizer->optimizer->set_lr(lr);
  });
}

int ddp_optimizer_destroy(ddp_optimizer* optimizer) {
  return guarded("ddp_optimizer_destroy", [&] {
    check_handle(optimizer, Kind::kOptimizer, "optimizer");
    --optimizer->owner->optimizers;
    retire(optimizer);
  });
}

int ddp_train_step(ddp_model* model, ddp_optimizer* optimizer, const float* x, int64_t x_rows, int64_t x_cols,
                   const float* y, int64_t y_rows, int64_t y_cols, int memory, double* loss) {
  return guarded("ddp_train_step", [&] {
    train_step_on_arrays(model, optimizer, x, x_rows, x_cols, y, y_rows, y_cols, memory, Completion::kSynchronous,
                         loss);
  });
}

int ddp_train_step_async(ddp_model* model, ddp_optimizer* optimizer, const float* x, int64_t x_rows, int64_t x_cols,
                         const float* y, int64_t y_rows, int64_t y_cols, int memory) {
  return guarded("ddp_train_step_async", [&] {
    train_step_on_arrays(model, optimizer, x, x_rows, x_cols, y, y_rows, y_cols, memory, Completion::kAsynchronous,
                         nullptr);
  });
}

int ddp_model_set_nonfinite(ddp_model* model, int policy) {
  return guarded("ddp_model_set_nonfinite", [&] {
    check_handle(model, Kind::kModel, "model");
    model->nonfinite = nonfinite_policy(policy);
  });
}

int ddp_model_nonfinite_skipped(const ddp_model* model, int64_t* skipped) {
  return guarded("ddp_model_nonfinite_skipped", [&] {
    check_handle(model, Kind::kModel, "model");
    require(skipped != nullptr, "skipped is NULL: pass the address of an int64_t");
    *skipped = model->nonfinite_skipped;
  });
}

int ddp_replay_buffer_create(ddp_session* session, int64_t capacity, int64_t inputs, int64_t targets, uint64_t seed,
                             ddp_replay_buffer** out) {
  return guarded("ddp_replay_buffer_create", [&] {
    require(out != nullptr, "out is NULL: pass the address of a ddp_replay_buffer* to receive the buffer");
    *out = nullptr;
    check_handle(session, Kind::kSession, "session");
    require(capacity > 0 && capacity <= (std::int64_t{1} << 34),
            "capacity is " + std::to_string(capacity) + ": pass the number of samples to hold (at least 1)");
    require(inputs > 0 && inputs <= (1 << 24) && targets > 0 && targets <= (1 << 24),
            "inputs " + std::to_string(inputs) + " and targets " + std::to_string(targets) +
                ": pass the model's input and output widths (1 to 16777216)");
    const ddp::Session& s = *session->session;
    auto b = std::make_unique<ddp_replay_buffer>();
    b->owner = session;
    b->buffer = std::make_unique<ddp::data::ReplayBuffer>(capacity, inputs, targets, s.device(), s.stream());
    b->key = seed ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(s.rank() + 1));
    s.stream().synchronize();
    *out = b.release();
    ++session->buffers;
    add(*out, Kind::kReplayBuffer);
  });
}

int ddp_replay_buffer_add(ddp_replay_buffer* buffer, const float* x, int64_t x_rows, int64_t x_cols, const float* y,
                          int64_t y_rows, int64_t y_cols, int memory) {
  return guarded("ddp_replay_buffer_add", [&] {
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    const ddp::data::ReplayBuffer& b = *buffer->buffer;
    const ddp::Session& s = *buffer->owner->session;
    check_arrays("the buffer", b.inputs(), b.targets(), s, x, x_rows, x_cols, y, y_rows, y_cols, memory);
    // The caller's arrays where they are: the buffer copies from either device.
    buffer->buffer->add(caller_array(x, x_rows, x_cols, memory, s), caller_array(y, y_rows, y_cols, memory, s),
                        s.stream());
    s.stream().synchronize();
  });
}

int ddp_replay_buffer_set_nonfinite(ddp_replay_buffer* buffer, int policy) {
  return guarded("ddp_replay_buffer_set_nonfinite", [&] {
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    buffer->buffer->set_nonfinite(nonfinite_policy(policy));
  });
}

int ddp_replay_buffer_nonfinite_skipped(const ddp_replay_buffer* buffer, int64_t* skipped) {
  return guarded("ddp_replay_buffer_nonfinite_skipped", [&] {
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    require(skipped != nullptr, "skipped is NULL: pass the address of an int64_t");
    *skipped = buffer->buffer->skipped();
  });
}

int ddp_replay_buffer_size(const ddp_replay_buffer* buffer, int64_t* size, int64_t* added) {
  return guarded("ddp_replay_buffer_size", [&] {
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    if (size != nullptr) *size = buffer->buffer->size();
    if (added != nullptr) *added = buffer->buffer->added();
  });
}

int ddp_replay_buffer_destroy(ddp_replay_buffer* buffer) {
  return guarded("ddp_replay_buffer_destroy", [&] {
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    --buffer->owner->buffers;
    retire(buffer);
  });
}

int ddp_train_step_replay(ddp_model* model, ddp_optimizer* optimizer, ddp_replay_buffer* buffer, int64_t batch,
                          double* loss) {
  return guarded("ddp_train_step_replay", [&] {
    check_step_handles(model, optimizer);
    check_handle(buffer, Kind::kReplayBuffer, "buffer");
    const ddp::data::ReplayBuffer& b = *buffer->buffer;
    require(buffer->owner == model->owner, "the buffer belongs to another session: pass one of the model's session");
    require(b.inputs() == model->in && b.targets() == model->out,
            "the buffer holds samples of " + std::to_string(b.inputs()) + " inputs and " +
                std::to_string(b.targets()) + " targets, but the model has " + std::to_string(model->in) + " and " +
                std::to_string(model->out) + ": make the buffer with the model's widths");
    require(batch > 0 && batch <= (1 << 24), "batch is " + std::to_string(batch) + ": pass 1 to 16777216 samples");
    require(b.size() > 0, "the buffer is empty: add samples (ddp_replay_buffer_add) before training on it");
    if (model->data_parallel != nullptr) require_mpi("ddp_train_step_replay");
    const ddp::Session& s = *model->owner->session;
    ddp::TrainStep& step = train_step_of(model, optimizer);
    // Drawn straight into the step's buffers.
    const ddp::StepResult result =
        step.fill_and_step(batch, model->in, model->out, [&](const ddp::Tensor& x, const ddp::Tensor& y) {
          buffer->buffer->sample(buffer->key, buffer->draws++, x, y, s.stream());
        }, loss != nullptr);
    finish(step, result, Completion::kSynchronous, loss);
  });
}

int ddp_predict(ddp_model* model, const float* x, int64_t x_rows, int64_t x_cols, int memory, float* y,
                int64_t y_rows, int64_t y_cols) {
  return guarded("ddp_predict", [&] {
    check_handle(model, Kind::kModel, "model");
    check_arrays(model, x, x_rows, x_cols, y, y_rows, y_cols, memory);
    const std::int64_t batch = x_rows;
    const ddp::Session& s = *model->owner->session;
    const ddp::Stream& stream = s.stream();
    ddp::autograd::NoGradGuard no_grad;
    // Prediction is inference: a Dropout passes its input through, as in PyTorch's eval mode.
    struct EvalMode {
      ddp::Module& m;
      bool training = m.is_training();
      explicit EvalMode(ddp::Module& module) : m(module) { m.eval(); }
      ~EvalMode() { m.train(training); }
    } eval_mode(*model->module);
    const ddp::Tensor outputs = model->module->forward(on_device(caller_array(x, batch, model->in, memory, s), s), stream);
    ddp::Tensor destination =
        memory == DDP_MEMORY_DEVICE
            ? ddp::Tensor::from_blob(y, {batch, model->out}, ddp::DType::kFloat32, s.device())
            : ddp::Tensor::from_blob(y, {batch, model->out}, ddp::DType::kFloat32, ddp::Device::cpu());
    destination.copy_from(outputs, stream);
    stream.synchronize();
  });
}

int ddp_checkpoint_save(ddp_model* model, ddp_optimizer* optimizer, const char* dir, int64_t step) {
  return guarded("ddp_checkpoint_save", [&] {
    check_step_handles(model, optimizer);
    require(dir != nullptr && dir[0] != '\0', "dir is NULL or empty: pass the checkpoint directory");
    require(step >= 0, "step is " + std::to_string(step) + ": pass the number of steps taken (>= 0)");
    require_mpi("ddp_checkpoint_save");
    ddp::io::CheckpointMetadata where;
    where.step = step;
    where.extra[kArchitectureKey] = model->architecture;
    ddp::training::save_training_checkpoint(*model->owner->session, dir, *model->module, *optimizer->optimizer, where);
  });
}

int ddp_checkpoint_load(ddp_model* model, ddp_optimizer* optimizer, const char* dir, int64_t* step) {
  return guarded("ddp_checkpoint_load", [&] {
    check_step_handles(model, optimizer);
    require(dir != nullptr && dir[0] != '\0', "dir is NULL or empty: pass the checkpoint directory");
    require(step != nullptr, "step is NULL: pass the address of an int64_t");
    require_mpi("ddp_checkpoint_load");
    // Refused before anything loads: tensors of the same shapes (another activation) would load without a word.
    const auto other_architecture = [&](const ddp::io::CheckpointContents& c) -> std::string {
      const auto it = c.metadata.extra.find(kArchitectureKey);
      if (it == c.metadata.extra.end() || it->second == model->architecture) return "";
      return c.path + " holds " + it->second + ", but the model is " + model->architecture +
             ": load it into a model made as the checkpoint's was, or save to another directory";
    };
    const std::optional<ddp::training::RestoredCheckpoint> restored =
        ddp::training::restore_latest_training_checkpoint(*model->owner->session, dir, *model->module,
                                                          *optimizer->optimizer, other_architecture);
    *step = restored ? restored->metadata.step : -1;
  });
}

}  // extern "C"
