// What a Trainer run is made of: the options a program sets, the loss and metrics of its own it may give, and
// what its hooks see. Apart from trainer.h so that the pieces of a run (its step, outputs and resume) read the
// options without the Trainer itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "runtime/models/module.h"
#include "runtime/optim/optimizer.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

// The arithmetic of the step. kTF32: FP32 storage, GEMMs on TF32 tensor cores (GPU). kBFloat16: bf16 GEMMs on
// a bf16 copy of the weights, FP32 master weights and update (autocast's recipe; an MLP's or a Sequential's of
// Linear and activation layers).
enum class Precision { kFloat32, kTF32, kBFloat16 };
// "fp32", "tf32" or "bf16"; InvalidArgument otherwise.
Precision parse_precision(const std::string& name);
std::string precision_name(Precision precision);

// The built-in losses. kCrossEntropy: logits against int32 class labels (accuracy is reported too); kMse:
// outputs against float targets of the same width.
enum class Loss { kCrossEntropy, kMse };
Loss parse_loss(const std::string& name);  // "cross-entropy" or "mse"
std::string loss_name(Loss loss);

// A loss, or a metric, of one's own: a function of the model's output for a batch and the batch's targets (int32
// labels [n], or float32 targets [n, width]) returning a one-element float32 tensor, through the ops (so that
// autograd differentiates a loss): the batch's mean.
using BatchFunction = std::function<Tensor(const Tensor& output, const Tensor& target)>;
// A metric reported after each evaluation as its mean over the test set (each chunk weighted by its rows).
struct Metric {
  std::string name;  // "test/<name>" in TensorBoard, "test_<name>" in the metrics file and the progress line
  BatchFunction value;
};

enum class LrScheduleKind { kConstant, kCosine };  // kCosine: linear warmup, then cosine decay to 0
// Where the training set is held while it trains: kDevice in the device's memory (data::ResidentDataset, the
// batch gathered there, the step a CUDA graph); kHost in the host's, each batch copied from pinned buffers that
// a prefetch thread fills (data::HostBatches; eager steps), for a data set larger than the device; kAuto picks
// kHost when the set would take more than half of the device memory free at the start on some rank.
enum class DataPlacement { kAuto, kDevice, kHost };

struct TrainerOptions {
  // The batch: per rank, or (global_batch_size > 0) over all ranks, split evenly (the per-rank size derived).
  std::int64_t batch_size = 128;
  std::int64_t global_batch_size = 0;
  int epochs = 1;
  std::int64_t max_steps = 0;  // 0: no limit; else optimizer steps since the run began (across resumes)
  // Seed of the data order (the model's initialisation is the model's own seed).
  std::uint64_t seed = 0;
  // The loss: a built-in one, or (when set) loss_function, named loss_function_name in checkpoints, so that a
  // resume with another loss is refused. metrics: more figures of one's own for each evaluation.
  Loss loss = Loss::kCrossEntropy;
  BatchFunction loss_function;
  std::string loss_function_name = "custom";
  std::vector<Metric> metrics;

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
  // (with clipping), test/loss, test/accuracy, test/<metric>.
  std::string tensorboard_dir;
  // The trained model as ONNX (rank 0, at the end of a run that was not stopped), for deployment runtimes.
  std::string onnx_file;
  // The name the run's lines start with ("trainer: 2 rank(s) on ...").
  std::string name = "trainer";
  // How messages name an option set to a value ("" for the option itself): by default ("resume_dir", "ck")
  // -> "TrainerOptions::resume_dir = ck". A program that sets these from flags of its own names its flags.
  std::function<std::string(const std::string& option, const std::string& value)> option_name;
};

// The optimizer `o.optimizer` describes, over `model`'s parameters (its state allocated on `stream`), and its
// learning rate (a schedule's peak).
std::unique_ptr<Optimizer> make_optimizer(const TrainerOptions& o, Module& model, const Stream& stream);
double optimizer_lr(const TrainerOptions& o);

// How `o`'s messages name `option` set to `value` (TrainerOptions::option_name, or the option's own name).
std::string option_text(const TrainerOptions& o, const std::string& option, const std::string& value = "");

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
  double accuracy = -1;  // the built-in cross-entropy only; -1 otherwise
  std::vector<std::pair<std::string, double>> metrics;  // TrainerOptions::metrics, in their order
};
struct TrainerHooks {
  // After each optimizer step, on every rank (a collective there is allowed: every rank calls it alike).
  std::function<void(const StepEnd&)> on_step_end;
  // After each epoch's evaluation (or each epoch's end when there is no test set), on every rank.
  std::function<void(const EvaluationResult&)> on_evaluation;
};

}  // namespace ddp
