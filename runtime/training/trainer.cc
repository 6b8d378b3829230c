// The trainer (see trainer.h): set-up, resume, the epochs with their steps, evaluation and the end of a run.
#include "runtime/training/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/graph.h"
#include "runtime/core/phase.h"
#include "runtime/core/settings.h"
#include "runtime/core/stop_request.h"
#include "runtime/data/evaluation_shard.h"
#include "runtime/data/host_batches.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/world.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/metrics.h"
#include "runtime/io/tensorboard.h"
#include "runtime/io/trace.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/training/fault_injection.h"
#include "runtime/training/onnx_export.h"
#include "runtime/training/precision_model.h"
#include "runtime/training/progress.h"
#include "runtime/training/training_checkpoint.h"

namespace ddp {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "tf32") return Precision::kTF32;
  if (name == "bf16") return Precision::kBFloat16;
  throw InvalidArgument("unknown precision '" + name + "': use fp32, tf32 or bf16");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kTF32:
      return "tf32";
    case Precision::kBFloat16:
      return "bf16";
    default:
      return "fp32";
  }
}

Loss parse_loss(const std::string& name) {
  if (name == "cross-entropy") return Loss::kCrossEntropy;
  if (name == "mse") return Loss::kMse;
  throw InvalidArgument("unknown loss '" + name + "': use cross-entropy or mse");
}

std::string loss_name(Loss loss) { return loss == Loss::kMse ? "mse" : "cross-entropy"; }

namespace {

using Clock = std::chrono::steady_clock;
// The process's start, as near as a library can see it: the time line of a run counts from here.
const Clock::time_point kProcessStart = Clock::now();
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// Seconds since the epoch, as the metrics' "time" (what TensorBoard and plots put on a wall-clock axis).
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The recipe keys of a checkpoint keep the names that checkpoints of the main job have always carried, so that
// those resume too.
constexpr const char* kRecipePrefix = "train_mlp.";

std::string optimizer_name(const TrainerOptions& o) {
  return std::holds_alternative<SgdOptions>(o.optimizer) ? "sgd" : "adamw";
}
double peak_lr(const TrainerOptions& o) {
  return std::visit([](const auto& options) { return options.lr; }, o.optimizer);
}

std::unique_ptr<Optimizer> make_optimizer(const TrainerOptions& o, MLP& mlp, const Stream& stream) {
  if (const auto* sgd = std::get_if<SgdOptions>(&o.optimizer)) return std::make_unique<Sgd>(mlp, *sgd, stream);
  return std::make_unique<AdamW>(mlp, std::get<AdamWOptions>(o.optimizer), stream);
}

// Where the run's wall time went, printed by rank 0 at the end (the GPU runs ahead of the host, so steps are
// charged when the host next waits for them: at a logged loss, an evaluation or a checkpoint).
struct PhaseTimes {
  double setup_s = 0, train_s = 0, eval_s = 0, checkpoint_s = 0;
  std::string summary(const WorldStartup& world, long long steps) const {
    char text[480];
    const double total = since(kProcessStart);
    const double world_s = world.mpi_s + world.device_s + world.nccl_s;
    std::snprintf(text, sizeof text,
                  "time: %.2f s from start: start-up %.2f s (MPI, device and NCCL %.2f = %.2f + %.2f + %.2f, "
                  "data, model and DDP %.2f), %lld steps %.2f s (%.0f us each), evaluation %.2f s, checkpoints "
                  "%.2f s",
                  total, total - train_s - eval_s - checkpoint_s, world_s, world.mpi_s, world.device_s, world.nccl_s,
                  setup_s, steps, train_s, steps > 0 ? train_s * 1e6 / steps : 0.0, eval_s, checkpoint_s);
    return text;
  }
};

// Where to resume from. An explicit resume_dir must hold a checkpoint; DDP_RESUME=1 (ddprun --max-restarts
// relaunching a failed job) continues from checkpoint_dir if it holds one, and starts from scratch if the job
// failed before its first checkpoint.
struct ResumeFrom {
  std::string dir;  // empty: a fresh start
  bool required = false;
};

ResumeFrom resume_directory(const TrainerOptions& o) {
  if (!o.resume_dir.empty()) return {o.resume_dir, true};
  if (o.resume_if_restarted && !o.checkpoint_dir.empty() && settings::flag(settings::setting("DDP_RESUME"))) {
    return {o.checkpoint_dir, false};
  }
  return {};
}

// What a checkpoint must have been written with to be resumed by this run, as it goes into its metadata: the
// model's shapes are checked by name when it loads, these would otherwise change the run silently. Both batch
// sizes are written; a resume checks the one this run fixes (the global batch, or the per-rank one), so the
// number of ranks may change.
std::map<std::string, std::string> recipe(const TrainerOptions& o, const MLP& mlp, int ranks) {
  const std::string p = kRecipePrefix;
  return {{p + "optimizer", optimizer_name(o)},
          {p + "activation", activation_name(mlp.activation())},
          {p + "batch_size", std::to_string(o.batch_size)},
          {p + "global_batch_size", std::to_string(o.batch_size * ranks)}};
}

// Why `checkpoint` cannot continue this run on `ranks` ranks, or "".
std::string recipe_mismatch(const io::LoadedCheckpoint& checkpoint, const TrainerOptions& o, const MLP& mlp,
                            int ranks) {
  const auto& m = checkpoint.metadata;
  if (m.seed != o.seed) {
    return checkpoint.path + " was written with --seed " + std::to_string(m.seed) + ", this run has --seed " +
           std::to_string(o.seed);
  }
  const std::string p = kRecipePrefix;
  const std::string unchecked = o.global_batch_size > 0 ? p + "batch_size" : p + "global_batch_size";
  for (const auto& [key, value] : recipe(o, mlp, ranks)) {
    const auto it = m.extra.find(key);
    if (key == unchecked || it == m.extra.end() || it->second == value) continue;  // older checkpoints do not say
    std::string flag = "--" + key.substr(p.size());
    std::replace(flag.begin(), flag.end(), '_', '-');
    std::string message = checkpoint.path + " was written with " + flag + " " + it->second + ", this run has " + flag +
                          " " + value + "; resume with the same " + flag;
    const auto global = m.extra.find(p + "global_batch_size");
    if (key == p + "batch_size" && global != m.extra.end()) {
      message += " (or --global-batch-size " + global->second + " to keep its global batch on any number of ranks)";
    }
    return message + ", or start a new run in another --checkpoint-dir";
  }
  return "";
}

// Checks a resume directory before looking in it, so that a typo or a file name gets its own message.
std::string resume_path_problem(const std::string& dir) {
  struct stat info;
  if (::stat(dir.c_str(), &info) != 0) return "--resume " + dir + ": no such directory";
  if (!S_ISDIR(info.st_mode)) {
    return "--resume " + dir + " is a file; pass the directory that holds the checkpoints (" + io::dirname_of(dir) +
           ")";
  }
  return "";
}

// The same directory, however it is written ("runs/a", "./runs/a/").
bool same_directory(const std::string& a, const std::string& b) {
  struct stat x, y;
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// Rank 0's claim on the checkpoint directory, before the first step: the directory is created and locked for
// this job (a second job is refused, naming the first), and a fresh run is refused where another run's
// checkpoints are, since keeping the newest files would then delete this run's own.
std::unique_ptr<io::CheckpointDirectoryLock> claim_checkpoint_dir(const TrainerOptions& o, const ResumeFrom& from) {
  auto lock = std::make_unique<io::CheckpointDirectoryLock>(o.checkpoint_dir);
  const std::vector<io::CheckpointFile> existing = io::list_checkpoints(o.checkpoint_dir);
  const bool continuing_it = !from.dir.empty() && same_directory(from.dir, o.checkpoint_dir);
  if (!existing.empty() && !continuing_it) {
    throw InvalidArgument("--checkpoint-dir " + o.checkpoint_dir +
                          " already holds another run's checkpoints (newest: " + io::basename_of(existing.back().path) +
                          "); to continue that run pass --resume " + o.checkpoint_dir +
                          ", to start over remove them or choose another --checkpoint-dir");
  }
  return lock;
}

// Rank r's trace file: trace_file itself for rank 0, TRACE.rank<r>.json beside it for the others.
std::string trace_path(const TrainerOptions& o, int rank) {
  return rank == 0 ? o.trace_file : o.trace_file + ".rank" + std::to_string(rank) + ".json";
}

// Whether the training set stays in the host's memory (TrainerOptions::data_placement); every rank alike.
bool train_from_host(const TrainerOptions& o, const Session& session, const data::Dataset& train_set) {
  if (o.data_placement != DataPlacement::kAuto) return o.data_placement == DataPlacement::kHost;
  if (!session.device().is_cuda()) return false;
  const data::DatasetView v = data::view(train_set);
  const double bytes = static_cast<double>(v.size) * (static_cast<double>(v.feature_count) * 4.0 +
                                                      static_cast<double>(v.y_row_bytes()));
  return session.any(bytes > 0.5 * static_cast<double>(cuda_free_memory(session.device())));
}

// Why the step cannot be a CUDA graph in this run, or "" when it can.
std::string graph_refusal(const TrainerOptions& o, const Session& session, const data::BatchSource& train) {
  if (!o.cuda_graph) return "--no-cuda-graph";
  if (!session.device().is_cuda()) return "the CPU has no graphs";
  if (!train.capturable()) return "the training set is copied from host memory at each step";
  if (session.backend() != Backend::kNccl) return "the MPI backend stages through the host";
  if (o.skip_nonfinite) return "--skip-nonfinite reads every loss on the host";
  if (o.clip_grad_norm > 0) return "--clip-grad-norm reads every gradient norm on the host";
  if (!o.trace_file.empty()) return "--trace-file times every backward on the host";
  return "";
}

struct ResumePoint {
  long long step = 0;
  long long epoch = 0;
  long long position = 0;  // global sample position within the epoch
  bool resumed = false;
  int world_size = 0;  // the checkpoint's
};

// The optimizer step count at the end of the run (without max_steps): the checkpoint's, then the batches left
// in its epoch at this run's ranks and batch, then whole epochs. Equal to steps_per_epoch * epochs unless the
// run resumed at another global batch (or skipped steps).
long long steps_at_end(const data::SamplerOptions& so, const ResumePoint& start, const TrainerOptions& o,
                       long long steps_per_epoch) {
  if (start.epoch >= o.epochs) return start.step;
  data::DistributedSampler rest(so);
  rest.set_epoch(start.epoch);
  rest.set_global_position(start.position);
  return start.step + rest.batches_per_epoch(o.batch_size) + (o.epochs - start.epoch - 1) * steps_per_epoch;
}

}  // namespace

// ---- The run: set-up, resume, the epochs, evaluation ----

class Trainer::Run {
 public:
  Run(const TrainerOptions& o, Session& session, MLP& mlp, const TrainerHooks& hooks)
      : o_(o), session_(session), mlp_(mlp), hooks_(hooks) {}

  // The data, held on the device that trains (or in the host's memory: TrainerOptions::data_placement), the
  // sampler that orders the training set, and the batch buffers each step gathers into (allocated once; the
  // last, shorter batch of an epoch goes into their first rows).
  void load_data(const data::Dataset& train_set, const data::Dataset& test_set) {
    session_.agree(data_problem(train_set, test_set), "the data does not fit the model");
    sampler_options_ = data::SamplerOptions{
        .dataset_size = train_set.size, .num_replicas = session_.size(), .rank = session_.rank(), .seed = o_.seed};
    sampler_ = std::make_unique<data::DistributedSampler>(sampler_options_);
    std::string error;
    try {
      sampler_->check_batch_size(o_.batch_size);
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "bad batch size");
    steps_per_epoch_ = sampler_->batches_per_epoch(o_.batch_size);
    if (train_from_host(o_, session_, train_set)) {
      train_ = std::make_unique<data::HostBatches>(data::view(train_set), sampler_options_, o_.batch_size,
                                                   session_.device(), stream_);
    } else {
      train_ = std::make_unique<data::ResidentDataset>(data::view(train_set), session_.device(), stream_);
    }
    if (test_set.size > 0) {
      test_ = std::make_unique<data::EvaluationShard>(test_set, session_.rank(), session_.size(), session_.device(),
                                                      stream_);
    }
    batch_x_ = Tensor::empty({o_.batch_size, train_set.feature_count}, DType::kFloat32, session_.device(), stream_);
    batch_y_ = train_->empty_y(o_.batch_size, stream_);
  }

  // The model in the run's precision under DistributedDataParallel, with its optimizer and schedule.
  void build_model() {
    model_ = std::make_unique<training::PrecisionModel>(mlp_, o_.precision);
    if (!o_.trace_file.empty()) trace_ = std::make_unique<io::TraceRecorder>(session_.rank());
    ddp_ = std::make_unique<DistributedDataParallel>(
        mlp_, session_,
        DdpOptions{.bucket_cap_mb = o_.bucket_mb, .trace = trace_.get(), .shard_optimizer = o_.shard_optimizer});
    optimizer_ = make_optimizer(o_, mlp_, stream_);
    model_->attach(*optimizer_, stream_);
    if (o_.schedule == LrScheduleKind::kCosine) {
      schedule_ = std::make_unique<CosineWithWarmup>(peak_lr(o_),
                                                     static_cast<std::int64_t>(o_.warmup_epochs * steps_per_epoch_),
                                                     steps_per_epoch_ * o_.epochs, 0.0);
    } else {
      schedule_ = std::make_unique<ConstantLr>(peak_lr(o_));
    }
  }

  // Outputs and resume, all checked before the first step; then the run's first line.
  void open_outputs_and_resume() {
    const ResumeFrom from = resume_directory(o_);
    std::string error;
    try {
      if (session_.is_lead() && !o_.checkpoint_dir.empty()) checkpoint_lock_ = claim_checkpoint_dir(o_, from);
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot use the checkpoint directory");
    start_ = resume(from);
    step_ = start_.step;
    total_steps_ = steps_at_end(sampler_options_, start_, o_, steps_per_epoch_);
    if (o_.max_steps > 0) total_steps_ = std::min<long long>(total_steps_, o_.max_steps);
    done_ = step_ >= total_steps_;
    error = "";
    try {
      // Two outputs in one file would overwrite each other (the trace, written last, would leave no metrics).
      const std::vector<std::pair<std::string, std::string>> files = {
          {"--metrics-file", o_.metrics_file}, {"--trace-file", o_.trace_file}, {"--onnx", o_.onnx_file}};
      for (std::size_t a = 0; a < files.size(); ++a) {
        for (std::size_t b = a + 1; b < files.size(); ++b) {
          if (!files[a].second.empty() && files[a].second == files[b].second) {
            throw InvalidArgument(files[a].first + " and " + files[b].first + " name the same file " + files[a].second +
                                  "; give each its own");
          }
        }
      }
      if (session_.is_lead() && !o_.metrics_file.empty()) {
        metrics_ = std::make_unique<io::MetricsWriter>(o_.metrics_file, start_.resumed);
      }
      if (!o_.trace_file.empty()) io::check_can_write_atomically(trace_path(o_, session_.rank()));
      if (!o_.onnx_file.empty()) io::check_can_write_atomically(o_.onnx_file);
      if (session_.is_lead() && !o_.tensorboard_dir.empty()) {
        tensorboard_ = std::make_unique<io::TensorBoardWriter>(o_.tensorboard_dir);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot write the run's outputs");
    graph_error_ = graph_refusal(o_, session_, *train_);
    print_run();
    progress_ = std::make_unique<training::Progress>(total_steps_, step_);
    if (graph_error_.empty() && total_steps_ > step_) {
      optimizer_->plan_steps(*schedule_, total_steps_ - step_, stream_);
    }
  }

  // Every epoch from the resume point to the end (or max_steps), each followed by an evaluation.
  void train() {
    const auto train_start = Clock::now();
    window_start_ = Clock::now();
    bool evaluated = false;
    for (long long epoch = start_.epoch; epoch < o_.epochs && !done_; ++epoch) {
      const long long position = run_epoch(epoch);
      const bool epoch_finished = sampler_->epoch_finished();
      if (stopped_) {  // no evaluation: the time until the job is killed is short
        if (last_saved_step_ != step_) save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
        break;
      }
      // The next epoch's order is drawn while the device still runs this one's queued steps, not after.
      if (!done_ && epoch + 1 < o_.epochs) sampler_->set_epoch(epoch + 1);
      // The host runs up to an epoch ahead of the device: wait here, so the time line charges the queued steps
      // to training and not to the evaluation that would otherwise wait for them (one wait per epoch).
      stream_.synchronize();
      const auto boundary_start = Clock::now();
      evaluate_epoch(epoch, epoch_finished);
      evaluated = true;
      if (done_) {
        // Mid-epoch, a checkpoint of this step may already be there (checkpoint_every): the same file again.
        if (last_saved_step_ != step_ || epoch_finished)
          save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
      } else if (epoch + 1 == o_.epochs) {
        save(epoch + 1, 0);
      }
      // The progress window goes on across the boundary without the evaluation and the checkpoint: its samples
      // since the last line were trained before them, so its clock skips them rather than restarting.
      window_start_ += Clock::now() - boundary_start;
    }
    if (!evaluated && !stopped_) last_eval_ = evaluate();
    times_.train_s = since(train_start) - times_.eval_s - times_.checkpoint_s;
  }

  // The exit status: 0, or kStoppedExitStatus after a graceful stop.
  int finish() {
    // Every rank writes its own track; rank r's file is TRACE.rank<r>.json beside rank 0's TRACE.
    if (trace_) trace_->write(trace_path(o_, session_.rank()));
    if (!stopped_ && !o_.onnx_file.empty()) {
      std::string error;
      try {
        if (session_.is_lead()) export_onnx(mlp_, o_.onnx_file, stream_);
      } catch (const std::exception& e) {
        error = e.what();
      }
      session_.agree(error, "cannot write the ONNX model");
      if (session_.is_lead()) progress_->line("onnx=" + o_.onnx_file);
    }
    if (stopped_) {
      // The signal and its time as the rank that received it saw them (the others only heard of it).
      const double waited = session_.max(seconds_since_stop_request());
      const int sig = static_cast<int>(session_.max(stop_signal()));
      if (session_.is_lead()) {
        const char* name = sig > 0 ? ::sigabbrev_np(sig) : nullptr;
        std::printf("%s\n", times_.summary(session_.world().startup(), step_ - start_.step).c_str());
        std::printf("%s: stopped at step %lld on %s%s (%.1f s after the request); %s\n", o_.name.c_str(), step_,
                    name != nullptr ? "SIG" : "", name != nullptr ? name : "request", waited,
                    o_.checkpoint_dir.empty() ? "no --checkpoint-dir, nothing saved"
                                              : ("resume with --resume " + o_.checkpoint_dir).c_str());
        std::fflush(stdout);
      }
      return kStoppedExitStatus;
    }
    if (session_.is_lead()) {
      std::printf("%s\n", times_.summary(session_.world().startup(), step_ - start_.step).c_str());
      std::printf("final step=%lld", step_);
      if (test_) std::printf(" test_loss=%.4f", last_eval_.loss);
      if (test_ && last_eval_.accuracy >= 0) std::printf(" test_accuracy=%.4f", last_eval_.accuracy);
      std::printf("\n");
      std::fflush(stdout);
    }
    return 0;
  }

  void add_setup_time(double seconds) { times_.setup_s += seconds; }
  const EvaluationResult& last_evaluation() const { return last_eval_; }
  long long step() const { return step_; }

 private:
  struct StepFigures {
    double mean_loss = 0;  // over ranks, read when logging (or when every loss must be checked)
    double grad_norm = 0;  // before clipping, with clip_grad_norm
    bool replayed = false;
  };

  // Why the data sets cannot train this model with this loss, or "".
  std::string data_problem(const data::Dataset& train_set, const data::Dataset& test_set) const {
    const std::int64_t in = mlp_.sizes().front(), out = mlp_.sizes().back();
    if (train_set.size <= 0) return "the training set is empty";
    if (o_.precision == Precision::kBFloat16 && !fused_activation(mlp_.activation())) {
      return std::string("bf16 precision takes relu or gelu activations; train ") +
             activation_name(mlp_.activation()) + " in fp32 or tf32";
    }
    for (const data::Dataset* d : {&train_set, &test_set}) {
      const std::string which = d == &train_set ? "training" : "test";
      if (d->size == 0) continue;
      if (d->feature_count != in) {
        // A test set unlike the training set is the data's fault, not the model's.
        const bool test_unlike_train = d != &train_set && train_set.feature_count == in;
        return "the " + which + " set has " + std::to_string(d->feature_count) + " features per sample, the model's " +
               "input has " + std::to_string(in) +
               (test_unlike_train ? " as the training set has; give a test set of the training set's features"
                                  : "; make the model's first size " + std::to_string(d->feature_count));
      }
      if (d->regression() != train_set.regression() || d->target_width != train_set.target_width) {
        return "the test set's targets are not of the training set's kind or width";
      }
      if (o_.loss == Loss::kMse && !d->regression()) {
        return "the loss is mse but the " + which +
               " set has class labels; use the cross-entropy loss, or float targets";
      }
      if (o_.loss == Loss::kCrossEntropy && d->regression()) {
        return "the loss is cross-entropy but the " + which + " set has float targets; use the mse loss, or integer " +
               "class labels";
      }
      if (d->regression() && d->target_width != out) {
        return "the " + which + " set's targets have width " + std::to_string(d->target_width) + ", the model's " +
               "output has " + std::to_string(out) + " units; make the model's last size " +
               std::to_string(d->target_width);
      }
      if (!d->regression() && d->num_classes > out) {
        return "the " + which + " set has " + std::to_string(d->num_classes) + " classes, the model's output has " +
               std::to_string(out) + " units; make the model's last size " + std::to_string(d->num_classes);
      }
    }
    return "";
  }

  void print_run() const {
    if (!session_.is_lead()) return;
    std::printf("%s: %d rank(s) on %s, backend %s, MLP", o_.name.c_str(), session_.size(),
                session_.device().str().c_str(), backend_name(session_.backend()).c_str());
    const std::vector<std::int64_t>& sizes = mlp_.sizes();
    for (std::size_t i = 0; i < sizes.size(); ++i)
      std::printf("%s%lld", i ? "-" : " ", static_cast<long long>(sizes[i]));
    std::printf(", batch %lld per rank (%lld global), %lld steps per epoch, %s lr %g, %s",
                static_cast<long long>(o_.batch_size), static_cast<long long>(o_.batch_size * session_.size()),
                steps_per_epoch_, optimizer_name(o_).c_str(), peak_lr(o_), precision_name(o_.precision).c_str());
    if (o_.shard_optimizer) std::printf(", optimizer state sharded over %d rank(s)", session_.size());
    if (session_.device().is_cuda()) {
      std::printf(", CUDA graph %s", graph_error_.empty() ? "on" : ("off: " + graph_error_).c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // Loads the newest complete checkpoint of `from` into the model and the optimizer, on every rank alike, or
  // starts from scratch where a restart finds none; anything else that is wrong ends every rank with one message.
  ResumePoint resume(const ResumeFrom& from) {
    if (from.dir.empty()) return {};
    session_.agree(from.required ? resume_path_problem(from.dir) : "", "cannot resume");
    const auto restored = training::restore_latest_training_checkpoint(
        session_, from.dir, mlp_, *optimizer_,
        [&](const io::LoadedCheckpoint& checkpoint) { return recipe_mismatch(checkpoint, o_, mlp_, session_.size()); },
        sampler_options_.dataset_size);
    session_.agree(!restored && from.required ? "no complete checkpoint in " + from.dir : "", "cannot resume");
    if (!restored) {
      if (session_.is_lead()) {
        std::printf("no complete checkpoint in %s yet (DDP_RESUME=1, a ddprun restart): starting from scratch\n",
                    from.dir.c_str());
      }
      return {};
    }
    model_->refresh(stream_);
    const io::CheckpointMetadata& m = restored->metadata;
    // Any number of ranks continues at the saved global position (the sampler lays the rest of the epoch out
    // over this run's ranks).
    const ResumePoint point{m.step, m.epoch, m.sampler_position, true, m.world_size};
    if (session_.is_lead()) {
      std::printf("resumed from %s: step %lld, epoch %lld, sample %lld", restored->path.c_str(), point.step,
                  point.epoch, point.position);
      if (point.world_size != session_.size()) {
        const auto global = m.extra.find(std::string(kRecipePrefix) + "global_batch_size");
        std::printf(" (written on %d ranks, continuing on %d; global batch %s -> %lld)", point.world_size,
                    session_.size(), global != m.extra.end() ? global->second.c_str() : "?",
                    static_cast<long long>(o_.batch_size * session_.size()));
      }
      std::printf("\n");
    }
    return point;
  }

  // One pass over the sampler's batches of `epoch` from where it stands; returns the global sample position
  // reached (the end of the epoch, or where max_steps stopped it).
  long long run_epoch(long long epoch) {
    data::DistributedSampler& sampler = *sampler_;
    sampler.set_epoch(epoch);
    sampler.set_global_position(epoch == start_.epoch ? start_.position : 0);
    train_->start_epoch(sampler, stream_);
    long long position = sampler.global_position();
    while (sampler.next_batch(o_.batch_size, &rows_)) {
      const auto n = static_cast<std::int64_t>(rows_.size());
      const bool full = n == o_.batch_size;
      const Tensor x = full ? batch_x_ : batch_x_.slice_rows(0, n);
      const Tensor y = full ? batch_y_ : batch_y_.slice_rows(0, n);
      position = sampler.global_position();
      schedule_->apply(*optimizer_);
      const bool log = (step_ + 1) % o_.log_every == 0 || step_ + 1 == total_steps_;
      StepFigures figures;
      if (!train_step(x, y, full, log, &figures)) continue;  // skipped: the next backward overwrites the gradients
      ++step_;
      skipped_in_a_row_ = 0;
      training::maybe_inject_fault(step_, session_.rank());
      window_samples_ += n * session_.size();
      ++window_steps_;
      if (log) log_step(epoch, figures);
      if (hooks_.on_step_end) {
        hooks_.on_step_end(
            StepEnd{.step = step_, .epoch = epoch, .logged = log, .loss = figures.mean_loss, .lr = optimizer_->lr()});
      }
      if (o_.checkpoint_every > 0 && step_ % o_.checkpoint_every == 0) save(epoch, position);
      if (step_ >= total_steps_) {
        done_ = true;
        break;
      }
      // A graceful stop: every rank sees the same answer after the same step.
      if (session_.stop_requested()) {
        stopped_ = done_ = true;
        break;
      }
    }
    return position;
  }

  // Forward, backward and update on (x, y); false when the step was skipped (skip_nonfinite).
  bool train_step(const Tensor& x, const Tensor& y, bool full, bool log, StepFigures* out) {
    // The batch: already in x and y when the replay before this step prefetched it, else gathered here.
    if (!train_->take_prefetched(x.size(0))) train_->gather_next(x, y, stream_);
    out->replayed = graph_error_.empty() && full && eager_steps_ >= kEagerStepsBeforeCapture;
    if (out->replayed) {
      const Tensor loss = graphed_step(x, y);
      // Reading the loss waits for the step: only when logging.
      if (log) out->mean_loss = session_.mean(loss.item(stream_));
      return true;
    }
    const Tensor loss = forward_backward(x, y);
    if (log || o_.skip_nonfinite) {
      // Reading the loss synchronises: only when logging, or when every step must be checked.
      const double value = loss.item(stream_);
      if (session_.any(!std::isfinite(value))) return reject_nonfinite_step("loss", value);
      out->mean_loss = session_.mean(value);
    }
    if (o_.clip_grad_norm > 0) {
      // Every rank holds the same averaged gradients, so every rank gets the same norm and decides alike.
      out->grad_norm = clip_grad_norm(*mlp_.parameter_store(), o_.clip_grad_norm, stream_);
      if (!std::isfinite(out->grad_norm)) return reject_nonfinite_step("gradient norm", out->grad_norm);
    }
    optimizer_->step(stream_);
    ++eager_steps_;
    return true;
  }

  Tensor forward_backward(const Tensor& x, const Tensor& y) {
    mlp_.zero_grad(stream_);
    Tensor loss = loss_of(x, y);
    ddp_->backward(loss);
    return loss;
  }

  // The run's loss of the model's output for x against y (float32 outputs for a regression's mse).
  Tensor loss_of(const Tensor& x, const Tensor& y) const {
    if (o_.loss == Loss::kMse) return ops::mse_loss(model_->forward(x, stream_, DType::kFloat32), y, stream_);
    return ops::cross_entropy(model_->forward(x, stream_), y, stream_);
  }

  // A full batch replays one CUDA graph of the whole step: forward, backward with its all-reduces, the update
  // kernel, which takes its learning rate and bias corrections from the optimizer's plan (a table of every
  // remaining step's scalars, written once), and beside the update, once backward has read x for the last time,
  // the next batch's gather from the data set's cursor. Nothing is launched between replays. The graph is
  // captured at the first full batch after a few eager ones (they fill the allocator's cache and cuBLASLt's
  // plans, so the capture allocates nothing); the shorter last batch of an epoch runs eagerly, from the same
  // cursor and the same plan.
  Tensor graphed_step(const Tensor& x, const Tensor& y) {
    optimizer_->prepare_step(stream_);
    if (!graph_.captured()) {
      graph_ = CudaGraph::capture(stream_, [&] {
        graph_loss_ = forward_backward(x, y);
        train_->prefetch_next(x, y, stream_);
        optimizer_->apply_step(stream_);
        train_->join_prefetch(stream_);
      });
      if (!graph_.captured()) autograd::clear_tape();
      // All ranks replay or none do: a rank stepping eagerly beside graphs would still issue the same
      // collectives, but a failed capture may have left NCCL calls behind that the others never see.
      const bool failed_somewhere = session_.any(!graph_.captured());
      if (failed_somewhere) {
        graph_error_ = graph_.captured() ? "another rank could not capture it" : graph_.error();
        graph_ = CudaGraph();
        if (session_.is_lead()) {
          progress_->line("CUDA graph off (" + graph_error_ +
                          "): eager steps from here; --no-cuda-graph skips the attempt");
        }
        Tensor loss = forward_backward(x, y);
        optimizer_->apply_step(stream_);
        return loss;
      }
    }
    graph_.replay(stream_);
    return graph_loss_;
  }

  // Called on every rank when `quantity` is not finite on some rank at the step about to be taken: without
  // skip_nonfinite the job ends with one message naming the ranks; with it the step is skipped (false).
  bool reject_nonfinite_step(const std::string& quantity, double local_value) {
    const std::string at = " at step " + std::to_string(step_ + 1);
    if (!o_.skip_nonfinite) {
      session_.agree(std::isfinite(local_value) ? ""
                                                : "the " + quantity + " is " + std::to_string(local_value) + at +
                                                      " (lower --lr, or pass --skip-nonfinite to skip such steps)",
                     "training diverged");
    }
    if (session_.is_lead()) {
      progress_->line("skipping step " + std::to_string(step_ + 1) + ": the " + quantity + " is not finite");
    }
    // Once the parameters themselves are not finite every step is skipped: a bound instead of a run that ends
    // 'successfully' with nothing learnt.
    ++skipped_in_a_row_;
    session_.agree(skipped_in_a_row_ < o_.skip_nonfinite_limit
                       ? ""
                       : std::to_string(skipped_in_a_row_) + " batches in a row gave a non-finite " + quantity + at +
                             " and were skipped (the parameters are probably no longer finite): lower --lr, or raise "
                             "--skip-nonfinite-limit",
                   "training diverged");
    return false;
  }

  void log_step(long long epoch, const StepFigures& figures) {
    const double seconds = std::chrono::duration<double>(Clock::now() - window_start_).count();
    const ReducerStats& stats = ddp_->last_stats();  // of the last eager step: a replay has no timings
    const double hidden = figures.replayed || !stats.timed || session_.size() == 1 ? -1.0
                          : stats.allreduce_ms > 0
                              ? std::clamp(1.0 - stats.exposed_comm_ms / stats.allreduce_ms, 0.0, 1.0)
                              : 1.0;
    if (session_.is_lead()) {
      const double rate = window_samples_ / std::max(seconds, 1e-9);
      progress_->step(step_, epoch, figures.mean_loss, rate, hidden);
      if (tensorboard_) {
        std::vector<std::pair<std::string, double>> values = {
            {"train/loss", figures.mean_loss},
            {"train/lr", optimizer_->lr()},
            {"train/samples_per_s", rate},
            {"train/step_ms", window_steps_ > 0 ? seconds * 1e3 / window_steps_ : 0.0}};
        if (hidden >= 0) {
          values.emplace_back("train/comm_hidden", hidden);
          values.emplace_back("train/exposed_comm_ms", stats.exposed_comm_ms);
        }
        if (o_.clip_grad_norm > 0) values.emplace_back("train/grad_norm", figures.grad_norm);
        tensorboard_->scalars(values, step_);
      }
      if (metrics_) {
        nlohmann::json line = {{"step", step_},
                               {"epoch", epoch},
                               {"loss", figures.mean_loss},
                               {"samples_per_s", rate},
                               {"step_ms", window_steps_ > 0 ? seconds * 1e3 / window_steps_ : 0.0},
                               {"time", wall_time()}};
        if (hidden >= 0) {  // the last eager step's all-reduce time, and the part of it backward did not hide
          line["comm_hidden"] = hidden;
          line["allreduce_ms"] = stats.allreduce_ms;
          line["exposed_comm_ms"] = stats.exposed_comm_ms;
        }
        line["lr"] = optimizer_->lr();
        if (o_.clip_grad_norm > 0) line["grad_norm"] = figures.grad_norm;  // before clipping
        metrics_->write(line);
      }
    }
    window_start_ = Clock::now();
    window_samples_ = 0;
    window_steps_ = 0;
  }

  // Loss (and accuracy) over the whole test set: a forward per chunk of this rank's shard with the sums kept on
  // the device, read back once, then summed over ranks.
  EvaluationResult evaluate() const {
    if (!test_) return EvaluationResult{.loss = NAN, .accuracy = -1};
    PhaseGuard evaluating(Phase::kEvaluation);  // what a hang report says of a rank stuck here
    autograd::NoGradGuard no_grad;
    mlp_.eval();
    const bool classes = o_.loss == Loss::kCrossEntropy;
    std::vector<std::pair<Tensor, Tensor>> parts;  // (mean loss, correct count) per chunk, on the device
    for (const data::DeviceBatch& c : test_->chunks()) {
      const Tensor out = model_->forward(c.features, stream_, DType::kFloat32);
      if (classes) {
        parts.emplace_back(ops::cross_entropy(out, c.labels, stream_), ops::count_correct(out, c.labels, stream_));
      } else {
        parts.emplace_back(ops::mse_loss(out, c.labels, stream_), Tensor());
      }
    }
    std::vector<double> sums = {0, 0, static_cast<double>(test_->rows())};  // loss * n, correct, n
    for (std::size_t k = 0; k < parts.size(); ++k) {                        // the first read waits for them all
      sums[0] += parts[k].first.item(stream_) * test_->chunks()[k].labels.size(0);
      if (classes) sums[1] += parts[k].second.item(stream_);
    }
    sums = session_.sum(sums);
    mlp_.train();
    return EvaluationResult{.loss = sums[0] / sums[2], .accuracy = classes ? sums[1] / sums[2] : -1.0};
  }

  void evaluate_epoch(long long epoch, bool epoch_finished) {
    const auto eval_start = Clock::now();
    last_eval_ = evaluate();
    last_eval_.epoch = epoch;
    last_eval_.epoch_finished = epoch_finished;
    times_.eval_s += since(eval_start);
    if (hooks_.on_evaluation) hooks_.on_evaluation(last_eval_);
    if (!session_.is_lead() || !test_) return;
    char line[160];
    int used = std::snprintf(line, sizeof line, "epoch=%lld%s test_loss=%.4f", epoch,
                             epoch_finished ? "" : " (partial)", last_eval_.loss);
    if (last_eval_.accuracy >= 0)
      std::snprintf(line + used, sizeof line - used, " test_accuracy=%.4f", last_eval_.accuracy);
    progress_->line(line);
    if (metrics_) {
      nlohmann::json record = {{"epoch", epoch}, {"test_loss", last_eval_.loss}, {"time", wall_time()}};
      if (last_eval_.accuracy >= 0) record["test_accuracy"] = last_eval_.accuracy;
      metrics_->write(record);
    }
    if (tensorboard_) {
      std::vector<std::pair<std::string, double>> values = {{"test/loss", last_eval_.loss}};
      if (last_eval_.accuracy >= 0) values.emplace_back("test/accuracy", last_eval_.accuracy);
      tensorboard_->scalars(values, step_);
    }
  }

  void save(long long epoch, long long position) {
    if (o_.checkpoint_dir.empty()) return;
    const auto save_start = Clock::now();
    io::CheckpointMetadata m;
    m.step = step_;
    m.epoch = epoch;
    m.sampler_position = position;
    // No rng_state: the only randomness after initialisation is the data order, drawn from (seed, epoch),
    // both of which the checkpoint holds.
    m.seed = o_.seed;
    m.extra = recipe(o_, mlp_, session_.size());
    const std::string path =
        training::save_training_checkpoint(session_, o_.checkpoint_dir, mlp_, *optimizer_, m, o_.keep_checkpoints);
    if (session_.is_lead()) progress_->line("checkpoint=" + path + " step=" + std::to_string(step_));
    last_saved_step_ = step_;
    times_.checkpoint_s += since(save_start);
  }

  static constexpr long long kEagerStepsBeforeCapture = 3;
  const TrainerOptions& o_;
  Session& session_;
  MLP& mlp_;
  const TrainerHooks& hooks_;
  const Stream& stream_ = session_.stream();
  PhaseTimes times_;
  // Data.
  data::SamplerOptions sampler_options_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  long long steps_per_epoch_ = 0, total_steps_ = 0;
  std::unique_ptr<data::BatchSource> train_;
  std::unique_ptr<data::EvaluationShard> test_;
  Tensor batch_x_, batch_y_;
  std::vector<std::int64_t> rows_;
  // Model.
  std::unique_ptr<training::PrecisionModel> model_;
  std::unique_ptr<io::TraceRecorder> trace_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  // Outputs and where the run stands.
  std::unique_ptr<io::CheckpointDirectoryLock> checkpoint_lock_;
  std::unique_ptr<io::MetricsWriter> metrics_;          // rank 0's
  std::unique_ptr<io::TensorBoardWriter> tensorboard_;  // rank 0's
  std::unique_ptr<training::Progress> progress_;
  ResumePoint start_;
  long long step_ = 0;
  bool done_ = false;     // max_steps reached (perhaps by the run resumed), or stopped
  bool stopped_ = false;  // a graceful stop (SIGTERM, SIGINT, SIGUSR1 to any rank or to ddprun)
  long long last_saved_step_ = -1;
  long long skipped_in_a_row_ = 0;
  EvaluationResult last_eval_;
  Clock::time_point window_start_;
  long long window_samples_ = 0;
  long long window_steps_ = 0;
  // The step as a CUDA graph.
  CudaGraph graph_;
  std::string graph_error_;  // why the step is not (or no longer) a graph; "" while it is
  Tensor graph_loss_;        // written by every replay
  long long eager_steps_ = 0;
};

void warm_up_device(const Session& session, const std::vector<std::int64_t>& sizes, Activation activation,
                    const TrainerOptions& options) {
  if (!session.device().is_cuda()) return;
  const Stream& stream = session.stream();
  MLP mlp(sizes, activation, options.seed, session.device(), stream);
  training::PrecisionModel model(mlp, options.precision);
  const std::unique_ptr<Optimizer> optimizer = make_optimizer(options, mlp, stream);
  model.attach(*optimizer, stream);
  const Tensor x = Tensor::zeros({options.batch_size, sizes.front()}, DType::kFloat32, session.device(), stream);
  mlp.zero_grad(stream);
  if (options.loss == Loss::kMse) {
    const Tensor y = Tensor::zeros({options.batch_size, sizes.back()}, DType::kFloat32, session.device(), stream);
    autograd::backward(ops::mse_loss(model.forward(x, stream, DType::kFloat32), y, stream), stream);
  } else {
    const Tensor y = Tensor::zeros({options.batch_size}, DType::kInt32, session.device(), stream);
    autograd::backward(ops::cross_entropy(model.forward(x, stream), y, stream), stream);
  }
  optimizer->step(stream);
  stream.synchronize();
}

Trainer::Trainer(Session& session, MLP& model, TrainerOptions options, TrainerHooks hooks)
    : session_(session), model_(model), options_(std::move(options)), hooks_(std::move(hooks)) {
  std::string error;
  try {
    if (options_.global_batch_size > 0) {
      options_.batch_size = data::per_replica_batch_size(options_.global_batch_size, session_.size());
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  session_.agree(error, "bad batch size");
}

Trainer::~Trainer() = default;

int Trainer::fit(const data::Dataset& train, const data::Dataset& test) {
  const auto setup_start = Clock::now();
  run_ = std::make_unique<Run>(options_, session_, model_, hooks_);
  run_->load_data(train, test);
  run_->build_model();
  run_->open_outputs_and_resume();
  run_->add_setup_time(since(setup_start));
  run_->train();
  return run_->finish();
}

const EvaluationResult& Trainer::last_evaluation() const {
  DDP_CHECK(run_ != nullptr, "Trainer::last_evaluation: call fit() first");
  return run_->last_evaluation();
}

std::int64_t Trainer::step() const { return run_ ? run_->step() : 0; }

}  // namespace ddp
