// The main job: an MLP trained on Fashion-MNIST across ranks with DistributedDataParallel, a command line over
// the library's Trainer (runtime/training/trainer.h), which does everything that happens after the flags.
//
//   ddprun -np 2 -- bazel-bin/examples/train_mlp    # defaults: 784-512-512-10, 0.905 test accuracy on 2 CPU ranks
//   ddprun -np 8 -- bazel-bin/examples/train_mlp --device cuda --checkpoint-dir ckpt --max-restarts 2
//
// Each rank reads its shard through a DistributedSampler, so N ranks with batch b see exactly the samples of one
// rank with batch N·b. Rank 0 shows progress and, after every epoch, the accuracy over the whole test set.
// Checkpoints hold the model under PyTorch's nn.Sequential names, the optimizer state and the sampler position;
// --resume (or DDP_RESUME=1 from ddprun's restarts) continues from the newest complete one with the same losses
// as a run never stopped. SIGTERM, SIGINT or SIGUSR1 (to ddprun or to any rank) stops every rank after the same
// step, writes a checkpoint there and exits with status 75 (ddp::kStoppedExitStatus).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp.h"
#include "examples/cli_checks.h"
#include "runtime/data/array_file.h"
#include "runtime/data/idx.h"
#include "runtime/data/sampler.h"
#include "runtime/training/trainer.h"

namespace {

using ddp::InvalidArgument;
using examples::kNonNegativeInteger;
using examples::kNonNegativeNumber;
using examples::kPositiveInteger;
using examples::kPositiveNumber;

// The command line: the run's TrainerOptions, with train_mlp's defaults, and what picks the data and the model.
struct Flags {
  ddp::TrainerOptions run{.batch_size = 128, .epochs = 30, .schedule = ddp::LrScheduleKind::kCosine,
                          .warmup_epochs = 0.5, .name = "train_mlp"};
  std::string data = ddp::data::kDefaultFashionMnistDir;
  std::string test_data;
  std::string loss;  // default: from the data (cross-entropy for class labels, mse for float targets)
  int hidden = 512;
  int layers = 2;
  std::string activation = "relu";
  double lr = 2e-3;
  double weight_decay = 0.05;
  double momentum = 0.9;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  std::string device = "auto";
  std::string precision = "fp32";
  std::string backend;  // default: nccl on CUDA, mpi on the CPU (or DDP_BACKEND)
  int threads = 0;
  bool no_cuda_graph = false;
  std::string data_placement = "auto";
};

// The flags of the data, the model and the run's length.
void add_data_and_model_flags(CLI::App& app, Flags& f) {
  app.add_option("--data", f.data,
                 "training data: a directory of Fashion-MNIST's IDX files, a directory with features.npy and "
                 "targets.npy, or a .safetensors file with 'features' and 'targets'")
      ->capture_default_str();
  app.add_option("--test-data", f.test_data,
                 "test data for your own --data, in the same forms (Fashion-MNIST has its own)");
  app.add_option("--loss", f.loss,
                 "cross-entropy or mse (default: cross-entropy for class labels, mse for float targets)")
      ->check(CLI::IsMember({"cross-entropy", "mse"}));
  app.add_option("--hidden", f.hidden, "units per hidden layer")->capture_default_str()->check(kPositiveInteger);
  app.add_option("--layers", f.layers, "hidden layers")->capture_default_str()->check(kNonNegativeInteger);
  app.add_option("--activation", f.activation, "relu, gelu, tanh, sigmoid or silu")
      ->capture_default_str()
      ->check(CLI::IsMember({"relu", "gelu", "tanh", "sigmoid", "silu"}));
  CLI::Option* per_rank = app.add_option("--batch-size", f.run.batch_size, "samples per rank per step")
                              ->capture_default_str()
                              ->check(kPositiveInteger);
  app.add_option("--global-batch-size", f.run.global_batch_size,
                 "samples per step over all ranks, kept at any number of ranks (the per-rank batch is derived)")
      ->check(kPositiveInteger)
      ->excludes(per_rank);
  app.add_option("--epochs", f.run.epochs, "passes over the training set")->capture_default_str()->check(kPositiveInteger);
  app.add_option("--max-steps", f.run.max_steps, "stop after this many optimizer steps since the run began (0: none)")
      ->capture_default_str()
      ->check(kNonNegativeInteger);
}

// The optimizer's flags.
void add_optimization_flags(CLI::App& app, Flags& f) {
  app.add_option("--lr", f.lr, "peak learning rate")->capture_default_str()->check(kPositiveNumber);
  app.add_option("--weight-decay", f.weight_decay, "weight decay")->capture_default_str()->check(kNonNegativeNumber);
  app.add_option("--momentum", f.momentum, "SGD momentum")
      ->capture_default_str()
      ->check(kNonNegativeNumber & CLI::Range(0.0, 0.9999));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--schedule", f.schedule, "constant or cosine (with linear warmup)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup-epochs", f.run.warmup_epochs, "linear warmup length for --schedule cosine")
      ->capture_default_str()
      ->check(kNonNegativeNumber);
}

// Where and how precisely the run computes and communicates, and its seed.
void add_device_flags(CLI::App& app, Flags& f) {
  app.add_option("--device", f.device, "auto, cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", f.precision,
                 "fp32, tf32 (GPU matmuls on TF32 tensor cores) or bf16 (bf16 GEMMs, FP32 master weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--backend", f.backend, "nccl or mpi (default: nccl on CUDA, mpi on the CPU)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--bucket-mb", f.run.bucket_mb, "gradient bucket cap in MB")
      ->capture_default_str()
      ->check(kPositiveNumber);
  app.add_option("--seed", f.run.seed, "seed of the initialisation and the data order")
      ->capture_default_str()
      ->check(examples::kSeed);
}

// Checkpoints, resuming and what the run writes.
void add_output_flags(CLI::App& app, Flags& f) {
  app.add_option("--checkpoint-dir", f.run.checkpoint_dir, "write checkpoints here (and at the end of the run)");
  app.add_option("--checkpoint-every", f.run.checkpoint_every, "steps between checkpoints (0: only at the end)")
      ->capture_default_str()
      ->check(kNonNegativeInteger);
  app.add_option("--keep-checkpoints", f.run.keep_checkpoints, "newest checkpoints kept")
      ->capture_default_str()
      ->check(kPositiveInteger);
  app.add_option("--resume", f.run.resume_dir, "continue from the newest complete checkpoint in this directory");
  app.add_option("--metrics-file", f.run.metrics_file, "JSON lines: one per logged step and one per epoch");
  app.add_option(
      "--trace-file", f.run.trace_file,
      "Chrome trace JSON of backward and the all-reduces, one per rank: rank 0's in FILE, rank r's in FILE.rank<r>.json");
  app.add_option("--tensorboard-dir", f.run.tensorboard_dir,
                 "TensorBoard event files here (rank 0): losses, LR, speed, tests");
  app.add_option("--onnx", f.run.onnx_file, "write the trained model here as ONNX at the end of the run");
  app.add_option("--log-every", f.run.log_every, "steps between progress lines")
      ->capture_default_str()
      ->check(kPositiveInteger);
}

// How each step runs: non-finite losses, clipping, the CUDA graph, data placement, sharding, threads.
void add_step_flags(CLI::App& app, Flags& f) {
  app.add_flag("--skip-nonfinite", f.run.skip_nonfinite, "skip a step whose loss is NaN or infinite instead of stopping");
  app.add_option("--skip-nonfinite-limit", f.run.skip_nonfinite_limit,
                 "with --skip-nonfinite: stop when this many steps in a row were skipped")
      ->capture_default_str()
      ->check(kPositiveInteger);
  app.add_option("--clip-grad-norm", f.run.clip_grad_norm,
                 "clip the averaged gradients to this total L2 norm before each update (0: no clipping)")
      ->capture_default_str()
      ->check(kNonNegativeNumber);
  app.add_flag("--no-cuda-graph", f.no_cuda_graph, "run every step eagerly instead of replaying a CUDA graph");
  app.add_option("--data-placement", f.data_placement, "where the training set is held: device, host (pinned, "
                 "copied per step: a set larger than the GPU) or auto (host when it would fill the GPU)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "device", "host"}));
  app.add_flag("--shard-optimizer", f.run.shard_optimizer,
               "shard the optimizer state over the ranks (ZeRO stage 1): reduce-scatter, update 1/N, all-gather");
  app.add_option("--threads", f.threads, "OpenBLAS threads per rank (0: cores / ranks on this node)")
      ->capture_default_str()
      ->check(kNonNegativeInteger);
}

// --help's sections.
void group_flags_in_help(CLI::App& app) {
  examples::group_help(
      app, {{"Data", {{"--data", "DIR or FILE"}, {"--test-data", "DIR or FILE"}, {"--batch-size", "N"},
                      {"--global-batch-size", "N"}, {"--seed", "N"}, {"--data-placement", "auto|device|host"}}},
            {"Model", {{"--hidden", "N"}, {"--layers", "N"}, {"--activation", "relu|gelu|tanh|sigmoid|silu"},
                       {"--loss", "cross-entropy|mse"}}},
            {"Optimization", {{"--optimizer", "sgd|adamw"}, {"--lr", "X"}, {"--schedule", "constant|cosine"},
                              {"--warmup-epochs", "X"}, {"--weight-decay", "X"}, {"--momentum", "X in [0, 0.9999]"},
                              {"--epochs", "N"}, {"--max-steps", "N"}, {"--clip-grad-norm", "X"},
                              {"--skip-nonfinite", ""}, {"--skip-nonfinite-limit", "N"}}},
            {"Precision and devices", {{"--precision", "fp32|tf32|bf16"}, {"--device", "auto|cpu|cuda"},
                                       {"--backend", "nccl|mpi"}, {"--bucket-mb", "MB"}, {"--shard-optimizer", ""},
                                       {"--threads", "N"}}},
            {"Checkpoints and resume", {{"--checkpoint-dir", "DIR"}, {"--checkpoint-every", "STEPS"},
                                        {"--keep-checkpoints", "N"}, {"--resume", "DIR"}}},
            {"Outputs", {{"--log-every", "STEPS"}, {"--metrics-file", "FILE"}, {"--tensorboard-dir", "DIR"},
                         {"--onnx", "FILE"}}},
            {"Debugging", {{"--trace-file", "FILE"}, {"--no-cuda-graph", ""}}}});
}

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv, int rank) {
  Flags f;
  CLI::App app{"Train an MLP on Fashion-MNIST with DistributedDataParallel (start it with ddprun or mpirun)."};
  // A flag given twice takes its last value, as most command lines do (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_data_and_model_flags(app, f);
  add_optimization_flags(app, f);
  add_device_flags(app, f);
  add_output_flags(app, f);
  add_step_flags(app, f);
  group_flags_in_help(app);
  examples::parse_or_throw(app, argc, argv, /*prints_help=*/rank == 0);
  if (f.schedule == "cosine" && f.run.warmup_epochs > f.run.epochs) {
    char text[160];
    std::snprintf(text, sizeof text, "--warmup-epochs %g is longer than the run (--epochs %d); make the warmup shorter",
                  f.run.warmup_epochs, f.run.epochs);
    throw InvalidArgument(text);
  }
  return f;
}

// How the library's messages name an option: by the flag that sets it here ("resume_dir", "ck" -> "--resume ck").
std::string flag_for(const std::string& option, const std::string& value) {
  std::string flag = option == "resume_dir"   ? "--resume"
                     : option == "onnx_file"  ? "--onnx"
                     : option == "cuda_graph" ? "--no-cuda-graph"
                                              : "--" + option;
  std::replace(flag.begin(), flag.end(), '_', '-');
  const bool switch_flag = option == "cuda_graph" || option == "skip_nonfinite";
  return switch_flag || value.empty() ? flag : flag + " " + value;
}

// The run's options: the command line's, with the ones a flag spells in words parsed.
ddp::TrainerOptions trainer_options(const Flags& f) {
  ddp::TrainerOptions o = f.run;
  o.option_name = flag_for;
  o.schedule = f.schedule == "cosine" ? ddp::LrScheduleKind::kCosine : ddp::LrScheduleKind::kConstant;
  o.precision = ddp::parse_precision(f.precision);
  o.cuda_graph = !f.no_cuda_graph;
  o.data_placement = f.data_placement == "host"     ? ddp::DataPlacement::kHost
                     : f.data_placement == "device" ? ddp::DataPlacement::kDevice
                                                    : ddp::DataPlacement::kAuto;
  if (f.optimizer == "sgd") {
    o.optimizer = ddp::SgdOptions{.lr = f.lr, .momentum = f.momentum, .weight_decay = f.weight_decay};
  } else {
    o.optimizer = ddp::AdamWOptions{.lr = f.lr, .weight_decay = f.weight_decay};
  }
  return o;
}

// The model's layer sizes: the data's features, --layers hidden layers of --hidden, its classes or target width.
std::vector<std::int64_t> layer_sizes(const Flags& f, std::int64_t features, std::int64_t outputs) {
  std::vector<std::int64_t> sizes = {features};
  for (int l = 0; l < f.layers; ++l) sizes.push_back(f.hidden);
  sizes.push_back(outputs);
  return sizes;
}

// The flags that name a place on the rank's own node (its data, its outputs, which may differ from node to node)
// or its share of the node's cores: not part of the recipe.
constexpr std::string_view kPerNodeFlags[] = {"--data",         "--test-data",       "--checkpoint-dir",
                                              "--resume",       "--metrics-file",    "--trace-file",
                                              "--tensorboard-dir", "--onnx",         "--threads"};

// The command line as the recipe every rank must share.
std::vector<std::pair<std::string, std::string>> recipe_settings(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> settings = ddp::command_line_settings(argc, argv);
  std::erase_if(settings, [](const auto& setting) {
    return std::find(std::begin(kPerNodeFlags), std::end(kPerNodeFlags), setting.first) != std::end(kPerNodeFlags);
  });
  return settings;
}

int train(int argc, char** argv) {
  // SIGTERM, SIGINT and SIGUSR1 (from ddprun, Slurm, Ctrl-C) ask for a stop after the current step, with a
  // checkpoint; a second one ends the process at once.
  ddp::install_stop_handlers();
  int mpi_rank = 0;  // for --help, printed once
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) mpi_rank = std::atoi(r);
  auto [flags, flag_error] = examples::parse_now_report_later<Flags>([&] { return parse_flags(argc, argv, mpi_rank); });
  // With a bad command line the session only serves to say so: on the CPU, so that nothing about the device
  // comes before the one message, and without reading the data.
  const bool bad_flags = !flag_error.empty();
  // The data set is read on a thread of its own while MPI, the device and NCCL start.
  auto data = std::async(std::launch::async, [&flags, bad_flags] {
    return bad_flags ? ddp::data::TrainTest{} : ddp::data::load_train_test(flags.data, flags.test_data);
  });
  ddp::Session session(&argc, &argv,
                       {.device = bad_flags ? ddp::DeviceRequest::kCpu : ddp::parse_device_request(flags.device),
                        .backend = bad_flags ? "mpi" : flags.backend,
                        .cpu_threads = flags.threads});
  if (flag_error.empty() && flags.run.global_batch_size > 0) {
    try {
      flags.run.batch_size = ddp::data::per_replica_batch_size(flags.run.global_batch_size, session.size());
    } catch (const InvalidArgument& e) {
      flag_error = e.what();
    }
  }
  session.agree(flag_error, "bad command line", ddp::AgreedError::kInput);
  session.agree_same(recipe_settings(argc, argv), "the ranks were started with different flags");
  ddp::TrainerOptions options = trainer_options(flags);
  const ddp::Activation activation = ddp::parse_activation(flags.activation);
  if (!ddp::data::is_array_dataset(flags.data)) {  // Fashion-MNIST's sizes are known: warm the device up meanwhile
    const auto sizes = layer_sizes(flags, ddp::data::kFashionMnistFeatures, ddp::data::kFashionMnistClasses);
    ddp::warm_up_device(session, sizes, activation, options);
  }
  ddp::data::TrainTest sets;
  std::string error;
  try {
    sets = data.get();
  } catch (const std::exception& e) {
    error = e.what();
  }
  session.agree(error, "cannot read the data set", ddp::AgreedError::kInput);
  const auto& [train_set, test_set] = sets;
  const bool regression = train_set.regression();
  options.loss = !flags.loss.empty() ? ddp::parse_loss(flags.loss)
                 : regression        ? ddp::Loss::kMse
                                     : ddp::Loss::kCrossEntropy;
  const auto sizes =
      layer_sizes(flags, train_set.feature_count, regression ? train_set.target_width : train_set.num_classes);
  ddp::MLP model(sizes, activation, flags.run.seed, session.device(), session.stream());
  ddp::Trainer trainer(session, model, options);
  return trainer.fit(train_set, test_set);
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] { return train(argc, argv); });
}
