// The main job: an MLP trained on Fashion-MNIST across ranks with DistributedDataParallel.
//
//   ddprun -np 2 -- bazel-bin/examples/train_mlp    # defaults: 784-512-512-10, 0.905 test accuracy, ~70 s on 2 CPU ranks
//   ddprun -np 8 -- bazel-bin/examples/train_mlp --device cuda --checkpoint-dir ckpt --max-restarts 2
//
// Each rank reads its shard through a DistributedSampler (rank r takes positions r, r+N, ... of a permutation
// drawn from (seed, epoch)), so N ranks with batch b see exactly the samples of one rank with batch N·b.
// Rank 0 shows progress and, after every epoch, the accuracy over the whole test set computed across ranks.
// Checkpoints hold the model under PyTorch's nn.Sequential names, the optimizer state and the sampler
// position; --resume (or DDP_RESUME=1 from ddprun's restarts) continues from the newest complete one and
// gives the same losses as a run never stopped (bitwise on the CPU with the same ranks). SIGTERM, SIGINT or
// SIGUSR1 (to ddprun or to any rank) stops every rank after the same step, writes a checkpoint there and exits
// with status 75 (ddp::kStoppedExitStatus); a second signal ends the process at once.
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp.h"

namespace {

using ddp::InvalidArgument;
using ddp::Tensor;

struct Flags {
  std::string data = ddp::data::kDefaultFashionMnistDir;
  int hidden = 512;
  int layers = 2;
  std::string activation = "relu";
  long long batch_size = 128;  // per rank
  long long global_batch_size = 0;  // 0: --batch-size per rank; else split over the ranks (batch_size derived)
  int epochs = 30;
  long long max_steps = 0;  // 0: no limit
  double lr = 2e-3;
  double weight_decay = 0.05;
  double momentum = 0.9;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  double warmup_epochs = 0.5;
  std::string device = "auto";
  std::string precision = "fp32";
  std::string backend;  // default: nccl on CUDA, mpi on the CPU (or DDP_BACKEND)
  double bucket_mb = 25.0;
  unsigned long long seed = 0;
  std::string checkpoint_dir;
  long long checkpoint_every = 0;  // steps; 0: only at the end
  int keep_checkpoints = 3;
  std::string resume;
  std::string metrics_file;
  std::string trace_file;
  long long log_every = 50;
  bool skip_nonfinite = false;
  long long skip_nonfinite_limit = 10;  // steps skipped in a row before the run stops
  double clip_grad_norm = 0;  // 0: no clipping
  int threads = 0;
  bool no_cuda_graph = false;
  bool shard_optimizer = false;  // ZeRO stage 1: each rank keeps 1/N of the optimizer state
};

// Number checks whose messages say what is wrong in words (CLI11's own print its range bounds, ~300 digits for
// a double) and that refuse NaN and infinity, which compare false with every bound.
CLI::Validator number_at_least(double low, bool integer) {
  return CLI::Validator(
      [low, integer](std::string& text) -> std::string {
        double value = 0;
        try {
          std::size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return "must be a number, got '" + text + "'";
        } catch (const std::exception&) {
          return "must be a number, got '" + text + "'";
        }
        if (!std::isfinite(value)) return "must be a finite number, got " + text;
        if (value < low) {
          char bound[32];
          std::snprintf(bound, sizeof bound, "%g", low);
          return std::string("must be at least ") + bound + ", got " + text;
        }
        if (integer && value != std::floor(value)) return "must be a whole number, got " + text;
        return "";
      },
      integer ? "INT>=" + std::to_string(static_cast<long long>(low)) : "NUMBER");
}
const CLI::Validator kPositiveInteger = number_at_least(1, true);
const CLI::Validator kNonNegativeInteger = number_at_least(0, true);
const CLI::Validator kNonNegativeNumber = number_at_least(0, false);
// Above zero: the smallest positive double, so 0 itself is refused.
const CLI::Validator kPositiveNumber = number_at_least(std::numeric_limits<double>::denorm_min(), false);

// What CLI11 did not take, in the order given, and the flag the first unknown one most likely meant: one whose
// name starts with it (--batch for --batch-size) or that it starts with.
std::string unknown_arguments(const CLI::App& app, const std::vector<std::string>& extras) {
  std::string text = extras.size() == 1 ? "unknown argument" : "unknown arguments";
  for (const std::string& e : extras) text += " '" + e + "'";
  for (const std::string& e : extras) {
    if (e.rfind("--", 0) != 0) continue;
    const std::string name = e.substr(2, e.find('=', 2) - 2);  // up to '=' or the end (npos - 2 stays past it)
    for (const CLI::Option* option : app.get_options()) {
      for (const std::string& known : option->get_lnames()) {
        if (!name.empty() && known != name && (known.rfind(name, 0) == 0 || name.rfind(known, 0) == 0)) {
          return text + "; did you mean --" + known + "?";
        }
      }
    }
    break;
  }
  return text;
}

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv, int rank) {
  Flags f;
  CLI::App app{"Train an MLP on Fashion-MNIST with DistributedDataParallel (start it with ddprun or mpirun)."};
  // Arguments no option takes are reported below, in order and with a suggestion, instead of by CLI11.
  app.allow_extras();
  // A flag given twice takes its last value, as most command lines do (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", f.data, "directory with the Fashion-MNIST IDX gzip files")->capture_default_str();
  app.add_option("--hidden", f.hidden, "units per hidden layer")->capture_default_str()->check(kPositiveInteger);
  app.add_option("--layers", f.layers, "hidden layers")->capture_default_str()->check(kNonNegativeInteger);
  app.add_option("--activation", f.activation, "relu or gelu")->capture_default_str()->check(CLI::IsMember({"relu", "gelu"}));
  CLI::Option* per_rank = app.add_option("--batch-size", f.batch_size, "samples per rank per step")
                              ->capture_default_str()
                              ->check(kPositiveInteger);
  app.add_option("--global-batch-size", f.global_batch_size,
                 "samples per step over all ranks, kept at any number of ranks (the per-rank batch is derived)")
      ->check(kPositiveInteger)
      ->excludes(per_rank);
  app.add_option("--epochs", f.epochs, "passes over the training set")->capture_default_str()->check(kPositiveInteger);
  app.add_option("--max-steps", f.max_steps, "stop after this many optimizer steps since the run began (0: none)")
      ->capture_default_str()->check(kNonNegativeInteger);
  app.add_option("--lr", f.lr, "peak learning rate")->capture_default_str()->check(kPositiveNumber);
  app.add_option("--weight-decay", f.weight_decay, "weight decay")->capture_default_str()->check(kNonNegativeNumber);
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str()->check(kNonNegativeNumber & CLI::Range(0.0, 0.9999));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--schedule", f.schedule, "constant or cosine (with linear warmup)")
      ->capture_default_str()->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup-epochs", f.warmup_epochs, "linear warmup length for --schedule cosine")
      ->capture_default_str()->check(kNonNegativeNumber);
  app.add_option("--device", f.device, "auto, cpu or cuda")->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", f.precision,
                 "fp32, tf32 (GPU matmuls on TF32 tensor cores) or bf16 (bf16 GEMMs, FP32 master weights)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--backend", f.backend, "nccl or mpi (default: nccl on CUDA, mpi on the CPU)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--bucket-mb", f.bucket_mb, "gradient bucket cap in MB")->capture_default_str()->check(kPositiveNumber);
  app.add_option("--seed", f.seed, "seed of the initialisation and the data order")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoints here (and at the end of the run)");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->capture_default_str()->check(kNonNegativeInteger);
  app.add_option("--keep-checkpoints", f.keep_checkpoints, "newest checkpoints kept")->capture_default_str()->check(kPositiveInteger);
  app.add_option("--resume", f.resume, "continue from the newest complete checkpoint in this directory");
  app.add_option("--metrics-file", f.metrics_file, "JSON lines: one per logged step and one per epoch");
  app.add_option("--trace-file", f.trace_file, "Chrome trace JSON of backward and the all-reduces (rank 0)");
  app.add_option("--log-every", f.log_every, "steps between progress lines")->capture_default_str()->check(kPositiveInteger);
  app.add_flag("--skip-nonfinite", f.skip_nonfinite, "skip a step whose loss is NaN or infinite instead of stopping");
  app.add_option("--skip-nonfinite-limit", f.skip_nonfinite_limit,
                 "with --skip-nonfinite: stop when this many steps in a row were skipped")
      ->capture_default_str()->check(kPositiveInteger);
  app.add_option("--clip-grad-norm", f.clip_grad_norm,
                 "clip the averaged gradients to this total L2 norm before each update (0: no clipping)")
      ->capture_default_str()
      ->check(kNonNegativeNumber);
  app.add_flag("--no-cuda-graph", f.no_cuda_graph, "run every step eagerly instead of replaying a CUDA graph");
  app.add_flag("--shard-optimizer", f.shard_optimizer,
               "shard the optimizer state over the ranks (ZeRO stage 1): reduce-scatter, update 1/N, all-gather");
  app.add_option("--threads", f.threads, "OpenBLAS threads per rank (0: cores / ranks on this node)")
      ->capture_default_str()->check(kNonNegativeInteger);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (rank == 0) std::printf("%s", app.help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(std::string(e.what()) + " (see --help)");
  }
  if (!app.remaining().empty()) throw InvalidArgument(unknown_arguments(app, app.remaining()) + " (see --help)");
  if (f.schedule == "cosine" && f.warmup_epochs > f.epochs) {
    char text[160];
    std::snprintf(text, sizeof text, "--warmup-epochs %g is longer than the run (--epochs %d); make the warmup shorter",
                  f.warmup_epochs, f.epochs);
    throw InvalidArgument(text);
  }
  return f;
}

// Where to resume from. An explicit --resume must find a checkpoint there; DDP_RESUME=1 (ddprun --max-restarts
// relaunching a failed job) continues from --checkpoint-dir if it holds one, and starts from scratch if the job
// failed before its first checkpoint.
struct ResumeFrom {
  std::string dir;  // empty: a fresh start
  bool required = false;
};

ResumeFrom resume_directory(const Flags& f) {
  if (!f.resume.empty()) return {f.resume, true};
  const char* env = std::getenv("DDP_RESUME");
  if (env != nullptr && std::string(env) == "1" && !f.checkpoint_dir.empty()) return {f.checkpoint_dir, false};
  return {};
}

// The flags a checkpoint must have been written with to be resumed by this run, as they go into its metadata:
// the model's shapes are checked by name when it loads, these would otherwise change the run silently. Both
// batch sizes are written; a resume checks the one this run fixes (--global-batch-size, or the per-rank
// --batch-size), so the number of ranks may change.
std::map<std::string, std::string> recipe(const Flags& f, int ranks) {
  return {{"train_mlp.optimizer", f.optimizer},
          {"train_mlp.activation", f.activation},
          {"train_mlp.batch_size", std::to_string(f.batch_size)},
          {"train_mlp.global_batch_size", std::to_string(f.batch_size * ranks)}};
}

// Why `checkpoint` cannot continue this run on `ranks` ranks, or "".
std::string recipe_mismatch(const ddp::io::LoadedCheckpoint& checkpoint, const Flags& f, int ranks) {
  const auto& m = checkpoint.metadata;
  if (m.seed != f.seed) {
    return checkpoint.path + " was written with --seed " + std::to_string(m.seed) + ", this run has --seed " +
           std::to_string(f.seed);
  }
  const std::string unchecked = f.global_batch_size > 0 ? "train_mlp.batch_size" : "train_mlp.global_batch_size";
  for (const auto& [key, value] : recipe(f, ranks)) {
    const auto it = m.extra.find(key);
    if (key == unchecked || it == m.extra.end() || it->second == value) continue;  // older checkpoints do not say
    const std::string flag = "--" + key.substr(key.find('.') + 1);
    std::string dashed = flag;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    std::string message = checkpoint.path + " was written with " + dashed + " " + it->second + ", this run has " +
                          dashed + " " + value + "; resume with the same " + dashed;
    const auto global = m.extra.find("train_mlp.global_batch_size");
    if (key == "train_mlp.batch_size" && global != m.extra.end()) {
      message += " (or --global-batch-size " + global->second + " to keep its global batch on any number of ranks)";
    }
    return message + ", or start a new run in another --checkpoint-dir";
  }
  return "";
}

// Checks a --resume directory before looking in it, so that a typo or a file name gets its own message.
std::string resume_path_problem(const std::string& dir) {
  struct stat info;
  if (::stat(dir.c_str(), &info) != 0) return "--resume " + dir + ": no such directory";
  if (!S_ISDIR(info.st_mode)) {
    return "--resume " + dir + " is a file; pass the directory that holds the checkpoints (" +
           ddp::io::dirname_of(dir) + ")";
  }
  return "";
}

// The same directory, however it is written ("runs/a", "./runs/a/").
bool same_directory(const std::string& a, const std::string& b) {
  struct stat x, y;
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// Rank 0's claim on --checkpoint-dir, before the first step: the directory is created and locked for this job
// (a second job is refused, naming the first), and a fresh run is refused where another run's checkpoints are,
// since keeping the newest files would then delete this run's own.
std::unique_ptr<ddp::io::CheckpointDirectoryLock> claim_checkpoint_dir(const Flags& f, const ResumeFrom& from) {
  auto lock = std::make_unique<ddp::io::CheckpointDirectoryLock>(f.checkpoint_dir);
  const std::vector<ddp::io::CheckpointFile> existing = ddp::io::list_checkpoints(f.checkpoint_dir);
  const bool continuing_it = !from.dir.empty() && same_directory(from.dir, f.checkpoint_dir);
  if (!existing.empty() && !continuing_it) {
    throw InvalidArgument("--checkpoint-dir " + f.checkpoint_dir + " already holds another run's checkpoints (newest: " +
                          ddp::io::basename_of(existing.back().path) + "); to continue that run pass --resume " +
                          f.checkpoint_dir + ", to start over remove them or choose another --checkpoint-dir");
  }
  return lock;
}

// Progress on rank 0: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI, and under mpirun,
// which hands ranks a pseudo-terminal but relays their output line by line with a prefix).
class Progress {
 public:
  explicit Progress(long long total_steps)
      : total_(total_steps), tty_(isatty(STDOUT_FILENO) == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {}
  void step(long long step, long long epoch, double loss, double samples_per_s, double hidden) {
    char line[256];
    int used = std::snprintf(line, sizeof line, "epoch %lld step %lld/%lld loss %.4f samples/s %.0f", epoch, step,
                             total_, loss, samples_per_s);
    // The share of all-reduce time hidden under backward; not measured (< 0) for a graph replay.
    if (hidden >= 0) std::snprintf(line + used, sizeof line - used, " comm_hidden %.0f%%", hidden * 100.0);
    if (tty_) {
      const int width = 30;
      const int filled = total_ > 0 ? static_cast<int>(width * static_cast<double>(step) / total_) : 0;
      std::printf("\r[%s%s] %s", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), line);
    } else {
      std::printf("%s\n", line);
    }
    std::fflush(stdout);
  }
  void line(const std::string& text) {
    std::printf("%s%s\n", tty_ ? "\n" : "", text.c_str());
    std::fflush(stdout);
  }

 private:
  long long total_;
  bool tty_;
};

// Fault injection for the reliability tests: DDP_FAULT_KILL_STEP=S and DDP_FAULT_KILL_RANK=R make rank R fail
// after optimizer step S, on the first attempt only (ddprun sets DDP_RESTART on restarts): killed by SIGKILL, or
// with DDP_FAULT_KIND=throw by an error of its own that the other ranks do not share. The time of the fault goes
// to DDP_FAULT_KILL_STAMP (a file) so the test can measure how fast the job ends.
void maybe_inject_fault(long long step, int rank) {
  static const char* at = std::getenv("DDP_FAULT_KILL_STEP");
  if (at == nullptr) return;
  const char* who = std::getenv("DDP_FAULT_KILL_RANK");
  const char* restart = std::getenv("DDP_RESTART");
  if (std::atoll(at) != step || (who != nullptr && std::atoi(who) != rank)) return;
  if (restart != nullptr && std::atoi(restart) > 0) return;
  if (const char* stamp = std::getenv("DDP_FAULT_KILL_STAMP")) {
    if (FILE* f = std::fopen(stamp, "w")) {
      std::fprintf(f, "%.3f\n", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
      std::fclose(f);
    }
  }
  const char* kind = std::getenv("DDP_FAULT_KIND");
  if (kind != nullptr && std::string(kind) == "throw") {
    throw ddp::Error("fault injection: an error on rank " + std::to_string(rank) + " alone after step " +
                     std::to_string(step));
  }
  std::fprintf(stderr, "rank %d: fault injection: SIGKILL after step %lld\n", rank, step);
  std::fflush(stderr);
  raise(SIGKILL);
}

// The model in the run's precision: FP32 (or TF32) GEMMs on the parameters themselves, or bf16 GEMMs on a bf16
// copy that the optimizer refreshes in its own pass, with FP32 master weights (as autocast; models/bf16_weights.h).
class PrecisionModel {
 public:
  PrecisionModel(ddp::MLP& mlp, const std::string& precision) : mlp_(mlp), bf16_(precision == "bf16") {
    if (precision == "tf32") mlp_.set_math_mode(ddp::MathMode::kTF32);
  }
  // After DistributedDataParallel has laid out the store (the copy follows that layout).
  void attach(ddp::Optimizer& optimizer, const ddp::Stream& stream) {
    if (!bf16_) return;
    weights_ = std::make_unique<ddp::Bf16Weights>(*mlp_.parameter_store(), stream);
    optimizer.set_bf16_copy(weights_->flat());
  }
  // After parameters were loaded from elsewhere (a checkpoint).
  void refresh(const ddp::Stream& stream) {
    if (weights_) weights_->refresh(stream);
  }
  // Logits of `x`; `dtype` float32 where a caller needs them so (argmax), else as the precision makes them.
  Tensor logits(const Tensor& x, const ddp::Stream& stream, ddp::DType dtype = ddp::DType::kBFloat16) const {
    return weights_ ? ddp::forward_bf16(mlp_, *weights_, x, stream, dtype) : mlp_.forward(x, stream);
  }
  ddp::MLP& mlp() const { return mlp_; }

 private:
  ddp::MLP& mlp_;
  bool bf16_;
  std::unique_ptr<ddp::Bf16Weights> weights_;
};

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Loss and accuracy over the whole test set: a forward per chunk of this rank's shard with the sums kept on the
// device, read back once, then summed over ranks.
Evaluation evaluate(const PrecisionModel& model, const ddp::data::EvaluationShard& test, const ddp::Session& session) {
  ddp::PhaseGuard evaluating(ddp::Phase::kEvaluation);  // what a hang report says of a rank stuck here
  ddp::autograd::NoGradGuard no_grad;
  const ddp::Stream& stream = session.stream();
  model.mlp().eval();
  std::vector<std::pair<Tensor, Tensor>> parts;  // (mean loss, correct count) per chunk, on the device
  for (const ddp::data::DeviceBatch& c : test.chunks()) {
    const Tensor logits = model.logits(c.features, stream, ddp::DType::kFloat32);
    parts.emplace_back(ddp::ops::cross_entropy(logits, c.labels, stream),
                       ddp::ops::count_correct(logits, c.labels, stream));
  }
  std::vector<double> sums = {0, 0, static_cast<double>(test.rows())};  // loss * n, correct, n
  for (std::size_t k = 0; k < parts.size(); ++k) {  // the first read waits for them all
    sums[0] += parts[k].first.item(stream) * test.chunks()[k].labels.numel();
    sums[1] += parts[k].second.item(stream);
  }
  sums = session.sum(sums);
  model.mlp().train();
  return Evaluation{sums[0] / sums[2], sums[1] / sums[2]};
}

// Rank r's trace file: --trace-file itself for rank 0, TRACE.rank<r>.json beside it for the others.
std::string trace_path(const Flags& f, int rank) {
  return rank == 0 ? f.trace_file : f.trace_file + ".rank" + std::to_string(rank) + ".json";
}

struct ResumePoint {
  long long step = 0;
  long long epoch = 0;
  long long position = 0;  // global sample position within the epoch
  bool resumed = false;
  int world_size = 0;  // the checkpoint's
};

// Loads the newest complete checkpoint of `from` into the model and the optimizer, on every rank alike, or
// starts from scratch where a restart finds none; anything else that is wrong ends every rank with one message.
ResumePoint resume(const ResumeFrom& from, const Flags& f, ddp::Session& session, PrecisionModel& model,
                   ddp::Optimizer& optimizer, long long dataset_size) {
  if (from.dir.empty()) return {};
  session.agree(from.required ? resume_path_problem(from.dir) : "", "cannot resume");
  const auto restored = ddp::training::restore_latest_training_checkpoint(
      session, from.dir, model.mlp(), optimizer,
      [&](const ddp::io::LoadedCheckpoint& checkpoint) { return recipe_mismatch(checkpoint, f, session.size()); },
      dataset_size);
  session.agree(!restored && from.required ? "no complete checkpoint in " + from.dir : "", "cannot resume");
  if (!restored) {
    if (session.is_lead()) {
      std::printf("no complete checkpoint in %s yet (DDP_RESUME=1, a ddprun restart): starting from scratch\n",
                  from.dir.c_str());
    }
    return {};
  }
  model.refresh(session.stream());
  const ddp::io::CheckpointMetadata& m = restored->metadata;
  // Any number of ranks continues at the saved global position (the sampler lays the rest of the epoch out
  // over this run's ranks).
  const ResumePoint point{m.step, m.epoch, m.sampler_position, true, m.world_size};
  if (session.is_lead()) {
    std::printf("resumed from %s: step %lld, epoch %lld, sample %lld", restored->path.c_str(), point.step,
                point.epoch, point.position);
    if (point.world_size != session.size()) {
      const auto global = m.extra.find("train_mlp.global_batch_size");
      std::printf(" (written on %d ranks, continuing on %d; global batch %s -> %lld)", point.world_size,
                  session.size(), global != m.extra.end() ? global->second.c_str() : "?",
                  f.batch_size * session.size());
    }
    std::printf("\n");
  }
  return point;
}

// The optimizer step count at the end of the run (without --max-steps): the checkpoint's, then the batches left
// in its epoch at this run's ranks and batch, then whole epochs. Equal to steps_per_epoch * epochs unless the
// run resumed at another global batch (or skipped steps).
long long steps_at_end(const ddp::data::SamplerOptions& so, const ResumePoint& start, const Flags& f,
                       long long steps_per_epoch) {
  if (start.epoch >= f.epochs) return start.step;
  ddp::data::DistributedSampler rest(so);
  rest.set_epoch(start.epoch);
  rest.set_global_position(start.position);
  return start.step + rest.batches_per_epoch(f.batch_size) + (f.epochs - start.epoch - 1) * steps_per_epoch;
}

// Why the step cannot be a CUDA graph in this run, or "" when it can.
std::string graph_refusal(const Flags& f, const ddp::Session& session) {
  if (f.no_cuda_graph) return "--no-cuda-graph";
  if (!session.device().is_cuda()) return "the CPU has no graphs";
  if (session.backend() != ddp::Backend::kNccl) return "the MPI backend stages through the host";
  if (f.skip_nonfinite) return "--skip-nonfinite reads every loss on the host";
  if (f.clip_grad_norm > 0) return "--clip-grad-norm reads every gradient norm on the host";
  if (!f.trace_file.empty()) return "--trace-file times every backward on the host";
  return "";
}

// Where the run's wall time went, printed by rank 0 at the end (the GPU runs ahead of the host, so steps are
// charged when the host next waits for them: at a logged loss, an evaluation or a checkpoint).
struct PhaseTimes {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start = Clock::now();
  double world_s = 0, warm_s = 0, data_s = 0, setup_s = 0, train_s = 0, eval_s = 0, checkpoint_s = 0;
  ddp::WorldStartup world;  // the parts of world_s
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  std::string summary(long long steps) const {
    char text[480];
    const double total = since(start);
    std::snprintf(text, sizeof text,
                  "time: %.2f s from start: start-up %.2f s (MPI, device and NCCL %.2f = %.2f + %.2f + %.2f, "
                  "device warm-up %.2f, data %.2f, model and DDP %.2f), %lld steps %.2f s (%.0f us each), "
                  "evaluation %.2f s, checkpoints %.2f s",
                  total, world_s + warm_s + data_s + setup_s, world_s, world.mpi_s, world.device_s, world.nccl_s,
                  warm_s, data_s, setup_s, steps, train_s, steps > 0 ? train_s * 1e6 / steps : 0.0, eval_s,
                  checkpoint_s);
    return text;
  }
};

// ---- The run: set-up, resume, the epochs, evaluation ----

// The data set's two splits, read on threads of their own while MPI, the device and NCCL start: both take a
// good part of a second, and neither needs the other.
std::pair<std::future<ddp::data::Dataset>, std::future<ddp::data::Dataset>> read_in_background(const std::string& dir) {
  auto read_split = [dir](ddp::data::Split split) { return ddp::data::load_fashion_mnist(dir, split); };
  return {std::async(std::launch::async, read_split, ddp::data::Split::kTrain),
          std::async(std::launch::async, read_split, ddp::data::Split::kTest)};
}

// The device, backend and threads the flags ask for (CLI11 has checked them; after a flag error they are the
// defaults, and the error is reported once the session exists).
ddp::SessionOptions session_options(const Flags& f) {
  ddp::SessionOptions options;
  options.device = ddp::parse_device_request(f.device);
  options.backend = f.backend;
  options.cpu_threads = f.threads;
  return options;
}

// The optimizer the flags name, over `mlp`'s parameters.
std::unique_ptr<ddp::Optimizer> make_optimizer(const Flags& f, ddp::MLP& mlp, const ddp::Stream& stream) {
  if (f.optimizer == "sgd") {
    return std::make_unique<ddp::Sgd>(
        mlp, ddp::SgdOptions{.lr = f.lr, .momentum = f.momentum, .weight_decay = f.weight_decay}, stream);
  }
  return std::make_unique<ddp::AdamW>(mlp, ddp::AdamWOptions{.lr = f.lr, .weight_decay = f.weight_decay}, stream);
}

ddp::Activation activation_of(const Flags& f) {
  return f.activation == "gelu" ? ddp::Activation::kGelu : ddp::Activation::kRelu;
}

// The model's layer sizes: Fashion-MNIST's pixels, --layers hidden layers of --hidden, its classes.
std::vector<std::int64_t> layer_sizes(const Flags& f) {
  std::vector<std::int64_t> sizes = {ddp::data::kFashionMnistFeatures};
  for (int l = 0; l < f.layers; ++l) sizes.push_back(f.hidden);
  sizes.push_back(ddp::data::kFashionMnistClasses);
  return sizes;
}

// The first step on a GPU loads every kernel it launches (CUDA loads them lazily) and makes cuBLASLt's plan for
// every GEMM shape: a good part of the start-up, with the device idle before and after. The start-up would
// otherwise spend that time waiting for the data set's read; so one step of a throwaway model of the same sizes,
// precision and optimizer runs on zeros meanwhile. What stays is what the real run reuses: the loaded kernels,
// the GEMM plans (each shape's first algorithm, the same one the run would pick) and the allocator's cache.
void warm_up_device(const Flags& f, const ddp::Session& session) {
  if (!session.device().is_cuda()) return;
  const ddp::Stream& stream = session.stream();
  ddp::MLP mlp(layer_sizes(f), activation_of(f), f.seed, session.device(), stream);
  PrecisionModel model(mlp, f.precision);
  const std::unique_ptr<ddp::Optimizer> optimizer = make_optimizer(f, mlp, stream);
  model.attach(*optimizer, stream);
  const Tensor x = Tensor::zeros({f.batch_size, ddp::data::kFashionMnistFeatures}, ddp::DType::kFloat32,
                                 session.device(), stream);
  const Tensor y = Tensor::zeros({f.batch_size}, ddp::DType::kInt32, session.device(), stream);
  mlp.zero_grad(stream);
  ddp::autograd::backward(ddp::ops::cross_entropy(model.logits(x, stream), y, stream), stream);
  optimizer->step(stream);
  stream.synchronize();
}

class Run {
 public:
  Run(const Flags& f, ddp::Session& session, PhaseTimes& times) : f_(f), session_(session), times_(times) {}

  // The data, held on the device that trains (the GPU's memory, or the host's), the sampler that orders the
  // training set, and the batch buffers each step gathers into (allocated once; the last, shorter batch of an
  // epoch goes into their first rows).
  void load_data(std::future<ddp::data::Dataset> train_file, std::future<ddp::data::Dataset> test_file) {
    ddp::data::Dataset train_set, test_set;
    std::string error;
    try {
      train_set = train_file.get();
      test_set = test_file.get();
      if (train_set.size < test_set.size) {
        error = "the training set of " + f_.data + " has " + std::to_string(train_set.size) +
                " samples and the test set " + std::to_string(test_set.size) +
                ": are the train-* and t10k-* files swapped?";
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot read the data set");
    sampler_options_ = ddp::data::SamplerOptions{
        .dataset_size = train_set.size, .num_replicas = session_.size(), .rank = session_.rank(), .seed = f_.seed};
    sampler_ = std::make_unique<ddp::data::DistributedSampler>(sampler_options_);
    error = "";
    try {
      sampler_->check_batch_size(f_.batch_size);
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "bad batch size");
    steps_per_epoch_ = sampler_->batches_per_epoch(f_.batch_size);
    train_ = std::make_unique<ddp::data::ResidentDataset>(ddp::data::view(train_set), session_.device(), stream_);
    test_ = std::make_unique<ddp::data::EvaluationShard>(test_set, session_.rank(), session_.size(), session_.device(),
                                                         stream_);
    sizes_ = layer_sizes(f_);
    batch_x_ =
        Tensor::empty({f_.batch_size, train_set.feature_count}, ddp::DType::kFloat32, session_.device(), stream_);
    batch_y_ = Tensor::empty({f_.batch_size}, ddp::DType::kInt32, session_.device(), stream_);
  }

  // The model in the run's precision under DistributedDataParallel, with its optimizer and schedule.
  void build_model() {
    mlp_ = std::make_unique<ddp::MLP>(sizes_, activation_of(f_), f_.seed, session_.device(), stream_);
    model_ = std::make_unique<PrecisionModel>(*mlp_, f_.precision);
    if (!f_.trace_file.empty()) trace_ = std::make_unique<ddp::io::TraceRecorder>(session_.rank());
    ddp_ = std::make_unique<ddp::DistributedDataParallel>(
        *mlp_, session_,
        ddp::DdpOptions{.bucket_cap_mb = f_.bucket_mb, .trace = trace_.get(), .shard_optimizer = f_.shard_optimizer});
    optimizer_ = make_optimizer(f_, *mlp_, stream_);
    model_->attach(*optimizer_, stream_);
    if (f_.schedule == "cosine") {
      schedule_ = std::make_unique<ddp::CosineWithWarmup>(
          f_.lr, static_cast<std::int64_t>(f_.warmup_epochs * steps_per_epoch_), steps_per_epoch_ * f_.epochs, 0.0);
    } else {
      schedule_ = std::make_unique<ddp::ConstantLr>(f_.lr);
    }
  }

  // Outputs and resume, all checked before the first step; then the run's first line.
  void open_outputs_and_resume() {
    const ResumeFrom from = resume_directory(f_);
    std::string error;
    try {
      if (session_.is_lead() && !f_.checkpoint_dir.empty()) checkpoint_lock_ = claim_checkpoint_dir(f_, from);
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot use the checkpoint directory");
    start_ = resume(from, f_, session_, *model_, *optimizer_, sampler_options_.dataset_size);
    step_ = start_.step;
    total_steps_ = steps_at_end(sampler_options_, start_, f_, steps_per_epoch_);
    if (f_.max_steps > 0) total_steps_ = std::min(total_steps_, f_.max_steps);
    done_ = step_ >= total_steps_;
    error = "";
    try {
      if (session_.is_lead() && !f_.metrics_file.empty()) {
        metrics_ = std::make_unique<ddp::io::MetricsWriter>(f_.metrics_file, start_.resumed);
      }
      if (!f_.trace_file.empty()) ddp::io::check_can_write_atomically(trace_path(f_, session_.rank()));
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot write the run's outputs");
    graph_error_ = graph_refusal(f_, session_);
    print_run();
    progress_ = std::make_unique<Progress>(total_steps_);
    if (graph_error_.empty() && total_steps_ > step_) optimizer_->plan_steps(*schedule_, total_steps_ - step_, stream_);
  }

  // Every epoch from the resume point to the end (or --max-steps), each followed by an evaluation.
  void train() {
    const auto train_start = PhaseTimes::Clock::now();
    window_start_ = std::chrono::steady_clock::now();
    bool evaluated = false;
    for (long long epoch = start_.epoch; epoch < f_.epochs && !done_; ++epoch) {
      const long long position = run_epoch(epoch);
      const bool epoch_finished = sampler_->epoch_finished();
      if (stopped_) {  // no evaluation: the time until the job is killed is short
        if (last_saved_step_ != step_) save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
        break;
      }
      // The next epoch's order is drawn while the device still runs this one's queued steps, not after.
      if (!done_ && epoch + 1 < f_.epochs) sampler_->set_epoch(epoch + 1);
      // The host runs up to an epoch ahead of the device: wait here, so the time line charges the queued steps
      // to training and not to the evaluation that would otherwise wait for them (one wait per epoch).
      stream_.synchronize();
      const auto boundary_start = std::chrono::steady_clock::now();
      evaluate_epoch(epoch, epoch_finished);
      evaluated = true;
      if (done_) {
        save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
      } else if (epoch + 1 == f_.epochs) {
        save(epoch + 1, 0);
      }
      // The progress window goes on across the boundary without the evaluation and the checkpoint: its samples
      // since the last line were trained before them, so its clock skips them rather than restarting.
      window_start_ += std::chrono::steady_clock::now() - boundary_start;
    }
    if (!evaluated && !stopped_) last_eval_ = evaluate(*model_, *test_, session_);
    times_.train_s = PhaseTimes::since(train_start) - times_.eval_s - times_.checkpoint_s;
  }

  // The exit status: 0, or ddp::kStoppedExitStatus after a graceful stop.
  int finish() {
    // Every rank writes its own track; rank r's file is TRACE.rank<r>.json beside rank 0's TRACE.
    if (trace_) trace_->write(trace_path(f_, session_.rank()));
    if (stopped_) {
      // The signal and its time as the rank that received it saw them (the others only heard of it).
      const double waited = session_.max(ddp::seconds_since_stop_request());
      const int sig = static_cast<int>(session_.max(ddp::stop_signal()));
      if (session_.is_lead()) {
        const char* name = sig > 0 ? ::sigabbrev_np(sig) : nullptr;
        std::printf("%s\n", times_.summary(step_ - start_.step).c_str());
        std::printf("train_mlp: stopped at step %lld on %s%s (%.1f s after the request); %s\n", step_,
                    name != nullptr ? "SIG" : "", name != nullptr ? name : "request", waited,
                    f_.checkpoint_dir.empty() ? "no --checkpoint-dir, nothing saved"
                                              : ("resume with --resume " + f_.checkpoint_dir).c_str());
        std::fflush(stdout);
      }
      return ddp::kStoppedExitStatus;
    }
    if (session_.is_lead()) {
      std::printf("%s\n", times_.summary(step_ - start_.step).c_str());
      std::printf("final step=%lld test_loss=%.4f test_accuracy=%.4f\n", step_, last_eval_.loss, last_eval_.accuracy);
    }
    return 0;
  }

 private:
  struct StepFigures {
    double mean_loss = 0;  // over ranks, read when logging (or when every loss must be checked)
    double grad_norm = 0;  // before clipping, with --clip-grad-norm
    bool replayed = false;
  };

  void print_run() const {
    if (!session_.is_lead()) return;
    std::printf("train_mlp: %d rank(s) on %s, backend %s, MLP", session_.size(), session_.device().str().c_str(),
                ddp::backend_name(session_.backend()).c_str());
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      std::printf("%s%lld", i ? "-" : " ", static_cast<long long>(sizes_[i]));
    }
    std::printf(", batch %lld per rank (%lld global), %lld steps per epoch, %s lr %g, %s", f_.batch_size,
                f_.batch_size * session_.size(), steps_per_epoch_, f_.optimizer.c_str(), f_.lr, f_.precision.c_str());
    if (f_.shard_optimizer) std::printf(", optimizer state sharded over %d rank(s)", session_.size());
    if (session_.device().is_cuda()) {
      std::printf(", CUDA graph %s", graph_error_.empty() ? "on" : ("off: " + graph_error_).c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // One pass over the sampler's batches of `epoch` from where it stands; returns the global sample position
  // reached (the end of the epoch, or where --max-steps stopped it).
  long long run_epoch(long long epoch) {
    ddp::data::DistributedSampler& sampler = *sampler_;
    sampler.set_epoch(epoch);
    sampler.set_global_position(epoch == start_.epoch ? start_.position : 0);
    train_->set_order(sampler.indices(), stream_);
    train_->set_cursor(sampler.local_position(), stream_);
    long long position = sampler.global_position();
    while (sampler.next_batch(f_.batch_size, &rows_)) {
      const auto n = static_cast<std::int64_t>(rows_.size());
      const bool full = n == f_.batch_size;
      const Tensor x = full ? batch_x_ : batch_x_.slice_rows(0, n);
      const Tensor y = full ? batch_y_ : batch_y_.slice_rows(0, n);
      position = sampler.global_position();
      schedule_->apply(*optimizer_);
      const bool log = (step_ + 1) % f_.log_every == 0 || step_ + 1 == total_steps_;
      StepFigures figures;
      if (!train_step(x, y, full, log, &figures)) continue;  // skipped: the next backward overwrites the gradients
      ++step_;
      skipped_in_a_row_ = 0;
      maybe_inject_fault(step_, session_.rank());
      window_samples_ += n * session_.size();
      if (log) log_step(epoch, figures);
      if (f_.checkpoint_every > 0 && step_ % f_.checkpoint_every == 0) save(epoch, position);
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

  // Forward, backward and update on (x, y); false when the step was skipped (--skip-nonfinite).
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
    if (log || f_.skip_nonfinite) {
      // Reading the loss synchronises: only when logging, or when every step must be checked.
      const double value = loss.item(stream_);
      if (session_.any(!std::isfinite(value))) return reject_nonfinite_step("loss", value);
      out->mean_loss = session_.mean(value);
    }
    if (f_.clip_grad_norm > 0) {
      // Every rank holds the same averaged gradients, so every rank gets the same norm and decides alike.
      out->grad_norm = ddp::clip_grad_norm(*mlp_->parameter_store(), f_.clip_grad_norm, stream_);
      if (!std::isfinite(out->grad_norm)) return reject_nonfinite_step("gradient norm", out->grad_norm);
    }
    optimizer_->step(stream_);
    ++eager_steps_;
    return true;
  }

  Tensor forward_backward(const Tensor& x, const Tensor& y) {
    mlp_->zero_grad(stream_);
    Tensor loss = ddp::ops::cross_entropy(model_->logits(x, stream_), y, stream_);
    ddp_->backward(loss);
    return loss;
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
      graph_ = ddp::CudaGraph::capture(stream_, [&] {
        graph_loss_ = forward_backward(x, y);
        train_->prefetch_next(x, y, stream_);
        optimizer_->apply_step(stream_);
        train_->join_prefetch(stream_);
      });
      if (!graph_.captured()) ddp::autograd::clear_tape();
      // All ranks replay or none do: a rank stepping eagerly beside graphs would still issue the same
      // collectives, but a failed capture may have left NCCL calls behind that the others never see.
      const bool failed_somewhere = session_.any(!graph_.captured());
      if (failed_somewhere) {
        graph_error_ = graph_.captured() ? "another rank could not capture it" : graph_.error();
        graph_ = ddp::CudaGraph();
        if (session_.is_lead()) {
          progress_->line("CUDA graph off (" + graph_error_ + "): eager steps from here; --no-cuda-graph skips the attempt");
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
  // --skip-nonfinite the job ends with one message naming the ranks; with it the step is skipped (false).
  bool reject_nonfinite_step(const std::string& quantity, double local_value) {
    const std::string at = " at step " + std::to_string(step_ + 1);
    if (!f_.skip_nonfinite) {
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
    session_.agree(skipped_in_a_row_ < f_.skip_nonfinite_limit
                       ? ""
                       : std::to_string(skipped_in_a_row_) + " batches in a row gave a non-finite " + quantity + at +
                             " and were skipped (the parameters are probably no longer finite): lower --lr, or raise "
                             "--skip-nonfinite-limit",
                   "training diverged");
    return false;
  }

  void log_step(long long epoch, const StepFigures& figures) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start_).count();
    const ddp::ReducerStats& stats = ddp_->last_stats();  // of the last eager step: a replay has no timings
    const double hidden = figures.replayed || !stats.timed ? -1.0
                          : stats.allreduce_ms > 0 ? std::clamp(1.0 - stats.exposed_comm_ms / stats.allreduce_ms, 0.0, 1.0)
                                                   : 1.0;
    if (session_.is_lead()) {
      const double rate = window_samples_ / std::max(seconds, 1e-9);
      progress_->step(step_, epoch, figures.mean_loss, rate, hidden);
      if (metrics_) {
        nlohmann::json line = {{"step", step_}, {"epoch", epoch}, {"loss", figures.mean_loss}, {"samples_per_s", rate}};
        if (hidden >= 0) line["comm_hidden"] = hidden;
        line["lr"] = optimizer_->lr();
        if (f_.clip_grad_norm > 0) line["grad_norm"] = figures.grad_norm;  // before clipping
        metrics_->write(line);
      }
    }
    window_start_ = std::chrono::steady_clock::now();
    window_samples_ = 0;
  }

  void evaluate_epoch(long long epoch, bool epoch_finished) {
    const auto eval_start = PhaseTimes::Clock::now();
    last_eval_ = evaluate(*model_, *test_, session_);
    times_.eval_s += PhaseTimes::since(eval_start);
    if (!session_.is_lead()) return;
    char line[160];
    std::snprintf(line, sizeof line, "epoch %lld%s test_loss=%.4f test_accuracy=%.4f", epoch,
                  epoch_finished ? "" : " (partial)", last_eval_.loss, last_eval_.accuracy);
    progress_->line(line);
    if (metrics_) {
      metrics_->write({{"epoch", epoch}, {"test_loss", last_eval_.loss}, {"test_accuracy", last_eval_.accuracy}});
    }
  }

  void save(long long epoch, long long position) {
    if (f_.checkpoint_dir.empty()) return;
    const auto save_start = PhaseTimes::Clock::now();
    ddp::io::CheckpointMetadata m;
    m.step = step_;
    m.epoch = epoch;
    m.sampler_position = position;
    // No rng_state: the only randomness after initialisation is the data order, drawn from (seed, epoch),
    // both of which the checkpoint holds.
    m.seed = f_.seed;
    m.extra = recipe(f_, session_.size());
    ddp::training::save_training_checkpoint(session_, f_.checkpoint_dir, *mlp_, *optimizer_, m, f_.keep_checkpoints);
    last_saved_step_ = step_;
    times_.checkpoint_s += PhaseTimes::since(save_start);
  }

  static constexpr long long kEagerStepsBeforeCapture = 3;
  const Flags& f_;
  ddp::Session& session_;
  PhaseTimes& times_;
  const ddp::Stream& stream_ = session_.stream();
  // Data.
  ddp::data::SamplerOptions sampler_options_;
  std::unique_ptr<ddp::data::DistributedSampler> sampler_;
  long long steps_per_epoch_ = 0, total_steps_ = 0;
  std::unique_ptr<ddp::data::ResidentDataset> train_;
  std::unique_ptr<ddp::data::EvaluationShard> test_;
  std::vector<std::int64_t> sizes_;  // the MLP's layer sizes
  Tensor batch_x_, batch_y_;
  std::vector<std::int64_t> rows_;
  // Model.
  std::unique_ptr<ddp::MLP> mlp_;
  std::unique_ptr<PrecisionModel> model_;
  std::unique_ptr<ddp::io::TraceRecorder> trace_;
  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  std::unique_ptr<ddp::Optimizer> optimizer_;
  std::unique_ptr<ddp::LrSchedule> schedule_;
  // Outputs and where the run stands.
  std::unique_ptr<ddp::io::CheckpointDirectoryLock> checkpoint_lock_;
  std::unique_ptr<ddp::io::MetricsWriter> metrics_;  // rank 0's
  std::unique_ptr<Progress> progress_;
  ResumePoint start_;
  long long step_ = 0;
  bool done_ = false;  // --max-steps reached (perhaps by the run resumed), or stopped
  bool stopped_ = false;
  long long last_saved_step_ = -1;  // a graceful stop (SIGTERM, SIGINT, SIGUSR1 to any rank or to ddprun)
  long long skipped_in_a_row_ = 0;
  Evaluation last_eval_;
  std::chrono::steady_clock::time_point window_start_;
  long long window_samples_ = 0;
  // The step as a CUDA graph.
  ddp::CudaGraph graph_;
  std::string graph_error_;  // why the step is not (or no longer) a graph; "" while it is
  Tensor graph_loss_;        // written by every replay
  long long eager_steps_ = 0;
};

int train(int argc, char** argv) {
  PhaseTimes times;
  // SIGTERM, SIGINT and SIGUSR1 (from ddprun, Slurm, Ctrl-C) ask for a stop after the current step, with a
  // checkpoint; a second one ends the process at once.
  ddp::install_stop_handlers();
  // Flags are parsed before the session exists (it needs --device and --backend) and refused once it does, so
  // a typo ends every rank with one message.
  int mpi_rank = 0;
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) mpi_rank = std::atoi(r);
  Flags flags;
  std::string flag_error;
  try {
    flags = parse_flags(argc, argv, mpi_rank);
  } catch (const InvalidArgument& e) {
    flag_error = e.what();
  }
  auto [train_file, test_file] = read_in_background(flags.data);
  ddp::Session session(&argc, &argv, session_options(flags));
  if (flag_error.empty() && flags.global_batch_size > 0) {
    try {
      flags.batch_size = ddp::data::per_replica_batch_size(flags.global_batch_size, session.size());
    } catch (const InvalidArgument& e) {
      flag_error = e.what();
    }
  }
  session.agree(flag_error, "bad command line");
  session.agree_same(ddp::command_line_settings(argc, argv), "the ranks were started with different flags");
  times.world_s = PhaseTimes::since(times.start);
  times.world = session.world().startup();

  const auto warm_start = PhaseTimes::Clock::now();
  warm_up_device(flags, session);  // while the data set is read
  times.warm_s = PhaseTimes::since(warm_start);
  Run run(flags, session, times);
  const auto data_start = PhaseTimes::Clock::now();
  run.load_data(std::move(train_file), std::move(test_file));
  times.data_s = PhaseTimes::since(data_start);
  const auto setup_start = PhaseTimes::Clock::now();
  run.build_model();
  run.open_outputs_and_resume();
  times.setup_s = PhaseTimes::since(setup_start);
  run.train();
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] { return train(argc, argv); });
}
