// The main job: an MLP trained on Fashion-MNIST across ranks with DistributedDataParallel.
//
//   ddprun -np 2 -- bazel-bin/examples/train_mlp    # defaults: 784-512-512-10, 0.905 test accuracy, ~80 s on 2 CPU ranks
//   ddprun -np 8 -- bazel-bin/examples/train_mlp --device cuda --checkpoint-dir ckpt --max-restarts 2
//
// Each rank reads its shard through a DistributedSampler (rank r takes positions r, r+N, ... of a permutation
// drawn from (seed, epoch)), so N ranks with batch b see exactly the samples of one rank with batch N·b.
// Rank 0 shows progress and, after every epoch, the accuracy over the whole test set computed across ranks.
// Checkpoints hold the model under PyTorch's nn.Sequential names, the optimizer state and the sampler
// position; --resume (or DDP_RESUME=1 from ddprun's restarts) continues from the newest complete one and
// gives the same losses as a run never stopped (bitwise on the CPU with the same ranks).
#include <cblas.h>
#include <mpi.h>
#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ddp.h"
#include "runtime/training/training_checkpoint.h"

namespace {

using ddp::InvalidArgument;
using ddp::Tensor;

struct Flags {
  std::string data = ddp::data::kDefaultFashionMnistDir;
  int hidden = 512;
  int layers = 2;
  std::string activation = "relu";
  long long batch_size = 128;  // per rank
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
  double clip_grad_norm = 0;  // 0: no clipping
  int threads = 0;
};

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv, int rank) {
  Flags f;
  CLI::App app{"Train an MLP on Fashion-MNIST with DistributedDataParallel (start it with ddprun or mpirun)."};
  // A flag given twice takes its last value, as most command lines do (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", f.data, "directory with the Fashion-MNIST IDX gzip files")->capture_default_str();
  app.add_option("--hidden", f.hidden, "units per hidden layer")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--layers", f.layers, "hidden layers")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--activation", f.activation, "relu or gelu")->capture_default_str()->check(CLI::IsMember({"relu", "gelu"}));
  app.add_option("--batch-size", f.batch_size, "samples per rank per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--epochs", f.epochs, "passes over the training set")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-steps", f.max_steps, "stop after this many optimizer steps since the run began (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--lr", f.lr, "peak learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", f.weight_decay, "weight decay")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str()->check(CLI::Range(0.0, 0.9999));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--schedule", f.schedule, "constant or cosine (with linear warmup)")
      ->capture_default_str()->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup-epochs", f.warmup_epochs, "linear warmup length for --schedule cosine")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--device", f.device, "auto, cpu or cuda")->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", f.precision, "fp32 or tf32 (GPU matmuls on TF32 tensor cores)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--backend", f.backend, "nccl or mpi (default: nccl on CUDA, mpi on the CPU)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--bucket-mb", f.bucket_mb, "gradient bucket cap in MB")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", f.seed, "seed of the initialisation and the data order")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir, "write checkpoints here (and at the end of the run)");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--keep-checkpoints", f.keep_checkpoints, "newest checkpoints kept")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--resume", f.resume, "continue from the newest complete checkpoint in this directory");
  app.add_option("--metrics-file", f.metrics_file, "JSON lines: one per logged step and one per epoch");
  app.add_option("--trace-file", f.trace_file, "Chrome trace JSON of backward and the all-reduces (rank 0)");
  app.add_option("--log-every", f.log_every, "steps between progress lines")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--skip-nonfinite", f.skip_nonfinite, "skip a step whose loss is NaN or infinite instead of stopping");
  app.add_option("--clip-grad-norm", f.clip_grad_norm,
                 "clip the averaged gradients to this total L2 norm before each update (0: no clipping)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", f.threads, "OpenBLAS threads per rank (0: cores / ranks on this node)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (rank == 0) std::printf("%s", app.help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(std::string(e.what()) + " (see --help)");
  }
  if (f.precision == "bf16") {
    throw InvalidArgument("--precision bf16 is not supported by train_mlp yet (bf16 master-weight training is in "
                          "bench/step_bench); use fp32 or tf32");
  }
  return f;
}

std::string resume_directory(const Flags& f) {
  if (!f.resume.empty()) return f.resume;
  // ddprun --max-restarts relaunches with DDP_RESUME=1: continue from --checkpoint-dir.
  const char* env = std::getenv("DDP_RESUME");
  if (env != nullptr && std::string(env) == "1" && !f.checkpoint_dir.empty()) return f.checkpoint_dir;
  return "";
}

// Progress on rank 0: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI, and under mpirun,
// which hands ranks a pseudo-terminal but relays their output line by line with a prefix).
class Progress {
 public:
  explicit Progress(long long total_steps)
      : total_(total_steps), tty_(isatty(STDOUT_FILENO) == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {}
  void step(long long step, long long epoch, double loss, double samples_per_s, double hidden) {
    char line[256];
    std::snprintf(line, sizeof line, "epoch %lld step %lld/%lld loss %.4f samples/s %.0f comm_hidden %.0f%%", epoch,
                  step, total_, loss, samples_per_s, hidden * 100.0);
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

// Fault injection for the reliability tests: DDP_FAULT_KILL_STEP=S and DDP_FAULT_KILL_RANK=R make rank R kill
// itself with SIGKILL after optimizer step S, on the first attempt only (ddprun sets DDP_RESTART on restarts).
// The time of death goes to DDP_FAULT_KILL_STAMP (a file) so the test can measure how fast the job ends.
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
  std::fprintf(stderr, "rank %d: fault injection: SIGKILL after step %lld\n", rank, step);
  std::fflush(stderr);
  raise(SIGKILL);
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Loss and accuracy over the whole test set: each rank takes an unpadded shard, sums are all-reduced.
Evaluation evaluate(ddp::Module& model, const ddp::data::Dataset& test, const ddp::World& world,
                    const ddp::Stream& stream) {
  ddp::autograd::NoGradGuard no_grad;
  model.eval();
  ddp::data::SamplerOptions so;
  so.dataset_size = test.size;
  so.num_replicas = world.size();
  so.rank = world.rank();
  so.shuffle = false;
  so.even = false;  // no padding: every test sample counted once
  ddp::data::DistributedSampler sampler(so);
  double sums[3] = {0, 0, 0};  // loss * n, correct, n
  std::vector<std::int64_t> rows;
  const std::int64_t f = test.feature_count;
  while (sampler.next_batch(1000, &rows)) {
    const std::int64_t n = static_cast<std::int64_t>(rows.size());
    std::vector<float> x(n * f);
    std::vector<std::int32_t> y(n);
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(test.features.begin() + rows[i] * f, f, x.begin() + i * f);
      y[i] = test.labels[rows[i]];
    }
    Tensor xt = Tensor::from_vector(x, {n, f}, world.device(), stream);
    Tensor yt = Tensor::from_int32(y, {n}, world.device(), stream);
    Tensor logits = model.forward(xt, stream);
    const float loss = ddp::ops::cross_entropy(logits, yt, stream).to_vector<float>(stream)[0];
    const std::int64_t correct = ddp::ops::count_correct(logits, yt, stream).to_vector<std::int64_t>(stream)[0];
    sums[0] += static_cast<double>(loss) * n;
    sums[1] += static_cast<double>(correct);
    sums[2] += static_cast<double>(n);
  }
  DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, world.comm()));
  model.train();
  return Evaluation{sums[0] / sums[2], sums[1] / sums[2]};
}

int train(int argc, char** argv) {
  // Flags are parsed before the world exists (it needs --device and --backend) and refused once it does, so
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
  ddp::WorldOptions world_options;
  try {
    world_options.device = ddp::parse_device_request(flags.device);
  } catch (const InvalidArgument&) {
  }
  if (!flags.backend.empty()) setenv("DDP_BACKEND", flags.backend.c_str(), 1);
  const char* backend_env = std::getenv("DDP_BACKEND");
  world_options.nccl = backend_env == nullptr || std::string(backend_env) != "mpi";
  ddp::World world(&argc, &argv, world_options);
  world.agree(flag_error, "bad command line");
  const bool lead = world.rank() == 0;

  if (world.device().is_cpu()) {
    int threads = flags.threads;
    if (threads == 0) threads = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) / world.local_size());
    openblas_set_num_threads(threads);
  }

  // ---- Data ----
  std::string data_error;
  ddp::data::Dataset train_set;
  ddp::data::Dataset test_set;
  try {
    train_set = ddp::data::load_fashion_mnist(flags.data, ddp::data::Split::kTrain);
    test_set = ddp::data::load_fashion_mnist(flags.data, ddp::data::Split::kTest);
  } catch (const std::exception& e) {
    data_error = e.what();
  }
  world.agree(data_error, "cannot read the data set");

  ddp::data::SamplerOptions so;
  so.dataset_size = train_set.size;
  so.num_replicas = world.size();
  so.rank = world.rank();
  so.seed = flags.seed;
  ddp::data::LoaderOptions lo;
  lo.batch_size = flags.batch_size;
  std::unique_ptr<ddp::data::BatchLoader> loader;
  std::string loader_error;
  try {
    loader = std::make_unique<ddp::data::BatchLoader>(ddp::data::view(train_set), ddp::data::DistributedSampler(so), lo);
  } catch (const std::exception& e) {
    loader_error = e.what();
  }
  world.agree(loader_error, "bad batch size");
  const long long steps_per_epoch = loader->batches_per_epoch();
  long long total_steps = steps_per_epoch * flags.epochs;
  if (flags.max_steps > 0) total_steps = std::min(total_steps, flags.max_steps);

  // ---- Model, DDP, optimizer ----
  ddp::Stream stream = ddp::Stream::create(world.device());
  std::vector<std::int64_t> sizes = {train_set.feature_count};
  for (int l = 0; l < flags.layers; ++l) sizes.push_back(flags.hidden);
  sizes.push_back(train_set.num_classes);
  const auto activation = flags.activation == "gelu" ? ddp::kernels::Activation::kGelu : ddp::kernels::Activation::kRelu;
  ddp::MLP model(sizes, activation, flags.seed, world.device(), stream);
  if (flags.precision == "tf32") model.set_math_mode(ddp::kernels::MathMode::kTF32);
  auto group = ddp::make_process_group(world, world.device(), ddp::default_backend(world.device()));
  std::unique_ptr<ddp::io::TraceRecorder> trace;
  if (!flags.trace_file.empty()) trace = std::make_unique<ddp::io::TraceRecorder>(world.rank());
  ddp::DdpOptions ddp_options;
  ddp_options.bucket_cap_mb = flags.bucket_mb;
  ddp_options.trace = trace.get();
  ddp::DistributedDataParallel ddp_model(model.flatten_parameters(stream), *group, world, stream, ddp_options);

  std::unique_ptr<ddp::Optimizer> optimizer;
  if (flags.optimizer == "sgd") {
    ddp::SgdOptions o;
    o.lr = flags.lr;
    o.momentum = flags.momentum;
    o.weight_decay = flags.weight_decay;
    optimizer = std::make_unique<ddp::Sgd>(*model.parameter_store(), o, stream);
  } else {
    ddp::AdamWOptions o;
    o.lr = flags.lr;
    o.weight_decay = flags.weight_decay;
    optimizer = std::make_unique<ddp::AdamW>(*model.parameter_store(), o, stream);
  }
  const long long schedule_steps = steps_per_epoch * flags.epochs;
  std::unique_ptr<ddp::LrSchedule> schedule;
  if (flags.schedule == "cosine") {
    schedule = std::make_unique<ddp::CosineWithWarmup>(
        flags.lr, static_cast<std::int64_t>(flags.warmup_epochs * steps_per_epoch), schedule_steps, 0.0);
  } else {
    schedule = std::make_unique<ddp::ConstantLr>(flags.lr);
  }

  // ---- Resume ----
  long long step = 0;
  long long start_epoch = 0;
  long long start_position = 0;
  const std::string resume_dir = resume_directory(flags);
  if (!resume_dir.empty()) {
    std::string error;
    std::optional<ddp::io::LoadedCheckpoint> checkpoint;
    try {
      checkpoint = ddp::io::latest_complete_checkpoint(resume_dir);
      if (!checkpoint) {
        error = "no complete checkpoint in " + resume_dir;
      } else {
        ddp::training::restore_training_checkpoint(*checkpoint, model, *optimizer, stream);
        const auto& m = checkpoint->metadata;
        if (m.seed != flags.seed) {
          error = checkpoint->path + " was written with --seed " + std::to_string(m.seed) + ", this run has --seed " +
                  std::to_string(flags.seed);
        }
        step = m.step;
        start_epoch = m.epoch;
        start_position = m.sampler_position;
        // Re-sharding: the global position must split evenly over this run's ranks (the loader checks it).
        if (error.empty() && start_position % world.size() != 0) {
          error = checkpoint->path + " stopped at global sample " + std::to_string(start_position) + " of epoch " +
                  std::to_string(start_epoch) + ", which " + std::to_string(world.size()) +
                  " ranks cannot split evenly; resume with " + std::to_string(m.world_size) + " ranks";
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    world.agree(error, "cannot resume");
    if (lead) {
      std::printf("resumed from %s: step %lld, epoch %lld, sample %lld\n", checkpoint->path.c_str(), step,
                  start_epoch, start_position);
    }
  }

  std::unique_ptr<ddp::io::MetricsWriter> metrics;
  if (lead && !flags.metrics_file.empty()) metrics = std::make_unique<ddp::io::MetricsWriter>(flags.metrics_file, !resume_dir.empty());
  if (lead) {
    std::printf("train_mlp: %d rank(s) on %s, backend %s, MLP", world.size(), world.device().str().c_str(),
                ddp::backend_name(group->backend()).c_str());
    for (std::size_t i = 0; i < sizes.size(); ++i) std::printf("%s%lld", i ? "-" : " ", static_cast<long long>(sizes[i]));
    std::printf(", batch %lld per rank (%lld global), %lld steps per epoch, %s lr %g\n", flags.batch_size,
                flags.batch_size * world.size(), steps_per_epoch, flags.optimizer.c_str(), flags.lr);
    std::fflush(stdout);
  }

  auto save = [&](long long epoch, long long position) {
    if (flags.checkpoint_dir.empty()) return;
    std::string error;
    if (lead) {
      try {
        ddp::io::CheckpointMetadata m;
        m.step = step;
        m.epoch = epoch;
        m.sampler_position = position;
        m.world_size = world.size();
        m.seed = flags.seed;
        m.rng_state = "sampler:seed+epoch";  // the only randomness after initialisation is the data order
        ddp::training::save_training_checkpoint(flags.checkpoint_dir, model, *optimizer, m, stream,
                                                flags.keep_checkpoints);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    world.agree(error, "checkpoint write failed");
  };

  // ---- Train ----
  Progress progress(total_steps);
  auto window_start = std::chrono::steady_clock::now();
  long long window_samples = 0;
  bool done = step >= total_steps;
  Evaluation last_eval;
  bool evaluated = false;
  // Called on every rank when `quantity` is not finite on some rank at the step about to be taken: without
  // --skip-nonfinite the job ends with one message naming the ranks; with it the caller skips the step.
  auto reject_nonfinite_step = [&](const std::string& quantity, double local_value) {
    if (!flags.skip_nonfinite) {
      world.agree(std::isfinite(local_value) ? ""
                                             : "the " + quantity + " is " + std::to_string(local_value) +
                                                   " at step " + std::to_string(step + 1) +
                                                   " (lower --lr, or pass --skip-nonfinite to skip such steps)",
                  "training diverged");
    }
    if (lead) progress.line("skipping step " + std::to_string(step + 1) + ": the " + quantity + " is not finite");
  };
  for (long long epoch = start_epoch; epoch < flags.epochs && !done; ++epoch) {
    loader->start_epoch(epoch, epoch == start_epoch ? start_position : 0);
    long long position = epoch == start_epoch ? start_position : 0;
    while (const ddp::data::Batch* batch = loader->next()) {
      Tensor x = Tensor::from_vector(std::vector<float>(batch->features, batch->features + batch->size * batch->feature_count),
                                     {batch->size, batch->feature_count}, world.device(), stream);
      Tensor y = Tensor::from_int32(std::vector<std::int32_t>(batch->labels, batch->labels + batch->size), {batch->size},
                                    world.device(), stream);
      position = batch->global_position_after;
      schedule->apply(*optimizer);
      model.zero_grad(stream);
      Tensor loss = ddp::ops::cross_entropy(model.forward(x, stream), y, stream);
      ddp_model.backward(loss);
      const bool log = (step + 1) % flags.log_every == 0 || step + 1 == total_steps;
      double mean_loss = 0;
      if (log || flags.skip_nonfinite) {
        // Reading the loss synchronises: only when logging, or when every step must be checked.
        const float value = loss.to_vector<float>(stream)[0];
        double bad = std::isfinite(value) ? 0.0 : 1.0;
        DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_DOUBLE, MPI_MAX, world.comm()));
        if (bad > 0) {
          reject_nonfinite_step("loss", value);
          continue;  // no update: the gradients are zeroed at the next step
        }
        mean_loss = value;
        DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &mean_loss, 1, MPI_DOUBLE, MPI_SUM, world.comm()));
        mean_loss /= world.size();
      }
      double grad_norm = 0;
      if (flags.clip_grad_norm > 0) {
        // Every rank holds the same averaged gradients, so every rank gets the same norm and decides alike.
        grad_norm = ddp::clip_grad_norm(*model.parameter_store(), flags.clip_grad_norm, stream);
        if (!std::isfinite(grad_norm)) {
          reject_nonfinite_step("gradient norm", grad_norm);
          continue;
        }
      }
      optimizer->step(stream);
      ++step;
      maybe_inject_fault(step, world.rank());
      window_samples += batch->size * world.size();
      if (log) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
        const ddp::ReducerStats& stats = ddp_model.last_stats();
        const double hidden =
            stats.allreduce_ms > 0 ? std::clamp(1.0 - stats.exposed_comm_ms / stats.allreduce_ms, 0.0, 1.0) : 1.0;
        if (lead) {
          const double rate = window_samples / std::max(seconds, 1e-9);
          progress.step(step, epoch, mean_loss, rate, hidden);
          if (metrics) {
            nlohmann::json line = {{"step", step},           {"epoch", epoch},        {"loss", mean_loss},
                                   {"samples_per_s", rate},  {"comm_hidden", hidden}, {"lr", optimizer->lr()}};
            if (flags.clip_grad_norm > 0) line["grad_norm"] = grad_norm;  // before clipping
            metrics->write(line);
          }
        }
        window_start = std::chrono::steady_clock::now();
        window_samples = 0;
      }
      if (flags.checkpoint_every > 0 && step % flags.checkpoint_every == 0) save(epoch, position);
      if (step >= total_steps) {
        done = true;
        break;
      }
    }
    const bool epoch_finished = position >= loader->num_samples() * world.size();
    last_eval = evaluate(model, test_set, world, stream);
    evaluated = true;
    if (lead) {
      char line[160];
      std::snprintf(line, sizeof line, "epoch %lld%s test_loss=%.4f test_accuracy=%.4f", epoch,
                    epoch_finished ? "" : " (partial)", last_eval.loss, last_eval.accuracy);
      progress.line(line);
      if (metrics) metrics->write({{"epoch", epoch}, {"test_loss", last_eval.loss}, {"test_accuracy", last_eval.accuracy}});
    }
    if (done) {
      save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
    } else if (epoch + 1 == flags.epochs) {
      save(epoch + 1, 0);
    }
    window_start = std::chrono::steady_clock::now();
  }
  if (!evaluated) last_eval = evaluate(model, test_set, world, stream);
  if (trace) {
    // Every rank writes its own track; rank r's file is TRACE.rank<r>.json beside rank 0's TRACE.
    const std::string path = world.rank() == 0 ? flags.trace_file : flags.trace_file + ".rank" + std::to_string(world.rank()) + ".json";
    trace->write(path);
  }
  if (lead) {
    std::printf("final step=%lld test_loss=%.4f test_accuracy=%.4f\n", step, last_eval.loss, last_eval.accuracy);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] { return train(argc, argv); });
}
