// Trainer: the training engine of the main job as a library object, so that a user's program gets the same
// speed and the same safety from a model, data, an optimizer recipe and a few lines:
//
//   ddp::Session session(&argc, &argv);
//   ddp::MLP model({784, 512, 512, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device(), session.stream());
//   ddp::Trainer trainer(session, model, {.batch_size = 128, .epochs = 30, .checkpoint_dir = "runs/a"});
//   return trainer.fit(train_set, test_set);      // 0, or ddp::kStoppedExitStatus after a graceful stop
//
// What fit() does, each part as the main job (examples/train_mlp.cc) has it:
// - the data sets go to the training device once (ResidentDataset, EvaluationShard); each rank takes its
//   DistributedSampler shard, in the sampler's order, resumable mid-epoch; on a GPU the next batch is gathered
//   beside the current update;
// - the model goes under DistributedDataParallel (ZeRO-1 with shard_optimizer), the optimizer is made after it
//   (its state follows the bucket layout), in FP32, TF32 or bf16 with FP32 master weights;
// - the step runs eagerly for a few steps, then, on a GPU over NCCL, as one captured CUDA graph of forward,
//   backward with its all-reduces, the update and the next batch's gather; the shorter last batch of an epoch
//   runs eagerly from the same state;
// - the learning-rate schedule, gradient clipping and the non-finite policy (stop, or skip with a bound);
// - checkpoints every N steps and at the end, the newest kept, in a directory this run locks and that another
//   run's checkpoints refuse; resume from the newest complete one (at the same world size bitwise, at another
//   with every sample seen once), refusing a checkpoint of another recipe with a message that says which;
// - the graceful stop (SIGTERM, SIGINT, SIGUSR1 to any rank or to ddprun): every rank stops after the same
//   step, writes a checkpoint there and fit() returns kStoppedExitStatus;
// - an evaluation after every epoch over the whole test set, progress on rank 0, metrics as JSON lines, a Chrome
//   trace, TensorBoard event files, the trained model as ONNX; and hooks after each step and each epoch's
//   evaluation for what a program adds.
//
// Everything is collective: every rank makes the same calls with the same options (a rank whose options differ
// is refused at start). Errors end every rank with one message (run_main prints it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "runtime/data/idx.h"
#include "runtime/distributed/session.h"
#include "runtime/models/layers.h"
#include "runtime/optim/optimizer.h"

namespace ddp {

// The arithmetic of the step. kTF32: FP32 storage, GEMMs on TF32 tensor cores (GPU). kBFloat16: bf16 GEMMs on
// a bf16 copy of the weights, FP32 master weights and update (autocast's recipe).
enum class Precision { kFloat32, kTF32, kBFloat16 };
// "fp32", "tf32" or "bf16"; InvalidArgument otherwise.
Precision parse_precision(const std::string& name);
std::string precision_name(Precision precision);

// The loss the model's output is trained on. kCrossEntropy: logits against int32 class labels (accuracy is
// reported too); kMse: outputs against float targets of the same width.
enum class Loss { kCrossEntropy, kMse };
Loss parse_loss(const std::string& name);  // "cross-entropy" or "mse"
std::string loss_name(Loss loss);

enum class LrScheduleKind { kConstant, kCosine };
// Where the training set is held while it trains: kDevice in the device's memory (data::ResidentDataset, the
// batch gathered there, the step a CUDA graph); kHost in the host's, each batch copied from pinned buffers that
// a prefetch thread fills (data::HostBatches; eager steps), for a data set larger than the device; kAuto picks
// kHost when the set would take more than half of the device memory free at the start on some rank.
enum class DataPlacement { kAuto, kDevice, kHost };  // kCosine: linear warmup, then cosine decay to 0

struct TrainerOptions {
  // The batch: per rank, or (global_batch_size > 0) over all ranks, split evenly (the per-rank size derived).
  std::int64_t batch_size = 128;
  std::int64_t global_batch_size = 0;
  int epochs = 1;
  std::int64_t max_steps = 0;  // 0: no limit; else optimizer steps since the run began (across resumes)
  // Seed of the data order (the model's initialisation is the model's own seed).
  std::uint64_t seed = 0;
  Loss loss = Loss::kCrossEntropy;

  // The optimizer and its learning rate (the schedule's peak).
  std::variant<AdamWOptions, SgdOptions> optimizer = AdamWOptions{};
  LrScheduleKind schedule = LrScheduleKind::kConstant;
  double warmup_epochs = 0;
  double clip_grad_norm = 0;  // 0: no clipping; else the averaged gradients' total L2 norm is clipped to it
  // A step whose loss (or gradient norm) is not finite ends the run, naming the ranks; or is skipped, up to
  // skip_nonfinite_limit steps in a row.
  bool skip_nonfinite = false;
  std::int64_t skip_nonfinite_limit = 10;

  Precision precision = Precision::kFloat32;
  bool cuda_graph = true;  // capture the step on a GPU over NCCL (it falls back to eager where it cannot)
  DataPlacement data_placement = DataPlacement::kAuto;
  double bucket_mb = 25.0;
  bool shard_optimizer = false;  // ZeRO stage 1

  // Checkpoints: every checkpoint_every steps (0: only at the end) into checkpoint_dir ("" writes none),
  // keeping the newest keep_checkpoints. resume_dir: continue from its newest complete checkpoint (it must have
  // one). resume_if_restarted: continue from checkpoint_dir when there is a checkpoint in it and DDP_RESUME=1
  // (ddprun's restarts set it), else start afresh.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int keep_checkpoints = 3;
  std::string resume_dir;
  bool resume_if_restarted = true;

  // Outputs: a progress line every log_every steps on rank 0, JSON lines (metrics_file, rank 0), a Chrome trace
  // of backward and the all-reduces (trace_file for rank 0, TRACE.rank<r>.json beside it for the others).
  std::int64_t log_every = 50;
  std::string metrics_file;
  std::string trace_file;
  // TensorBoard event files in this directory (rank 0): train/loss, train/lr, train/samples_per_s,
  // train/step_ms, train/comm_hidden and train/exposed_comm_ms (eager steps on several ranks), train/grad_norm
  // (with clipping), test/loss, test/accuracy.
  std::string tensorboard_dir;
  // The trained model as ONNX (rank 0, at the end of a run that was not stopped), for deployment runtimes.
  std::string onnx_file;
  // The name the run's lines start with ("train_mlp: 2 rank(s) on ...").
  std::string name = "trainer";
};

// What a hook sees.
struct StepEnd {
  std::int64_t step = 0;   // optimizer steps taken so far
  std::int64_t epoch = 0;
  bool logged = false;     // a logging step: loss holds the mean loss over ranks
  double loss = 0;
  double lr = 0;
};
struct EvaluationResult {
  std::int64_t epoch = 0;
  bool epoch_finished = true;
  double loss = 0;       // mean over the test set
  double accuracy = -1;  // classification only; -1 otherwise
};
struct TrainerHooks {
  // After each optimizer step, on every rank (a collective there is allowed: every rank calls it alike).
  std::function<void(const StepEnd&)> on_step_end;
  // After each epoch's evaluation (or each epoch's end when there is no test set), on every rank.
  std::function<void(const EvaluationResult&)> on_evaluation;
};

class Trainer {
 public:
  // `model` must outlive the trainer; its parameters are broadcast from rank 0 when fit() starts.
  Trainer(Session& session, MLP& model, TrainerOptions options, TrainerHooks hooks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on `train` (and evaluates on `test` after every epoch when it has rows) until the epochs or
  // max_steps are done or a graceful stop; returns 0, or kStoppedExitStatus after a stop (its checkpoint
  // written). Both data sets are copied to the device; they may go away afterwards. Collective.
  int fit(const data::Dataset& train, const data::Dataset& test);

  // The last evaluation (after fit).
  const EvaluationResult& last_evaluation() const;
  // Optimizer steps taken (across resumes).
  std::int64_t step() const;

 private:
  class Run;
  Session& session_;
  MLP& model_;
  TrainerOptions options_;
  TrainerHooks hooks_;
  std::unique_ptr<Run> run_;
};

// The first step on a GPU loads every kernel it launches (CUDA loads them lazily) and makes cuBLASLt's plan
// for every GEMM shape: a good part of the start-up. A program that reads its data on another thread calls this
// meanwhile: one step of a throwaway MLP of these sizes, precision and optimizer on zeros. What stays is what
// the run reuses: the loaded kernels, the GEMM plans and the allocator's cache. Does nothing on the CPU.
void warm_up_device(const Session& session, const std::vector<std::int64_t>& sizes, Activation activation,
                    const TrainerOptions& options);

}  // namespace ddp
