// TrainStep: one training step as a unit, for the Trainer and for a loop of one's own alike. The program gives
// its forward, loss and backward as a function of the batch; the step zeroes the gradients before it, and after
// it applies the non-finite policy, clips and updates with the optimizer. The first steps run eagerly; then, on a
// GPU where the session allows, the whole step is captured once as a CUDA graph and replayed, one launch a step,
// with the next batch gathered into the step's buffers beside the update. On the CPU the same code runs eagerly.
//
//   ddp::TrainStep step(session, optimizer, [&](const ddp::Tensor& x, const ddp::Tensor& y) {
//     ddp::Tensor loss = ddp::ops::cross_entropy(model.forward(x), y);
//     ddp_model.backward(loss);
//     return loss;
//   });
//   ddp::StepResult r = step(x, y);               // batches of one's own, copied into the step's buffers
//   step.use_source(resident, batch, features);   // or a data set on the device: step.next(rows)
//
// What a captured step may not do, and what each says when the capture meets it: read a value on the host
// (Tensor::item), change shape from replay to replay, a DistributedDataParallel backward under join or with
// find_unused_parameters, an optimizer step of its own (the step updates with the optimizer it was given).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/data/batch_source.h"
#include "runtime/distributed/session.h"
#include "runtime/optim/optimizer.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

struct TrainStepOptions {
  bool cuda_graph = true;          // capture the step on a GPU where the session allows it (see eager_reason)
  std::int64_t eager_steps = 3;    // before the capture: they load the kernels and fill the allocator's cache
  double clip_grad_norm = 0;       // 0: no clipping; else the averaged gradients' total L2 norm is clipped to it
  // The gradients are zeroed before the step function runs, as its backward adds to them. false: the function
  // writes every gradient itself (a fused pass such as FusedMlpMse), and the zeroing would only cost time.
  bool zero_grad = true;
  // A step whose loss (or gradient norm) is not finite ends the run on every rank, naming the ranks; or, with
  // skip_nonfinite, is skipped, up to skip_nonfinite_limit steps in a row.
  bool skip_nonfinite = false;
  std::int64_t skip_nonfinite_limit = 10;
  // true: every rank makes the same steps (a data-parallel model), and the ranks decide together (the capture,
  // a non-finite loss). false: each rank steps on its own (a model that is not data-parallel); the step then
  // makes no collective call of its own.
  bool ranks_step_together = true;
  // Batches given to operator() that hold a NaN or an infinity are refused: InvalidArgument naming the row and
  // column, and no update (parameters, optimizer state and step count as before). A batch of float32 matrices
  // of the first batch's widths is checked on the device as it is copied in, so a captured step never waits for
  // it: the refusal comes when the step is next waited for (a read loss, synchronize()). Ranks stepping together
  // agree on the device (an all-reduce beside the gradients'): a batch refused on one rank is the step refused on
  // every rank, each refusal naming that rank, row and column. Any other batch is checked on the host, on its
  // rank alone.
  bool refuse_nonfinite_samples = false;
  // A capture that fails: false refuses (CollectiveError on every rank naming what broke it), true goes on
  // eagerly from the same state and says why once, through `say`.
  bool eager_if_capture_fails = false;
  // How messages name one of these options, set to `value` ("" for the option itself): by default
  // ("skip_nonfinite", "true") -> "TrainStepOptions::skip_nonfinite = true". A program that sets the options
  // from flags of its own names its flags instead.
  std::function<std::string(const std::string& option, const std::string& value)> option_name;
  // Where the step's one-line notes go (rank 0 only); stdout by default.
  std::function<void(const std::string& line)> say;
};

struct StepResult {
  bool taken = true;      // false: skipped under skip_nonfinite (the next step overwrites the gradients)
  bool replayed = false;  // the captured graph ran the step
  bool loss_read = false;
  double loss = 0;        // this rank's, when read
  double mean_loss = 0;   // over the ranks (this rank's when they do not step together), when read
  double grad_norm = 0;   // with clip_grad_norm: the norm before clipping
};

class TrainStep {
 public:
  // Forward, loss and backward of one batch; returns the loss (a one-element float32 tensor). The step zeroes
  // the gradients before calling it.
  using Function = std::function<Tensor(const Tensor& x, const Tensor& y)>;

  // `optimizer` (and the session) must outlive the step. Collective (unless ranks_step_together is false): every
  // rank makes the same steps.
  TrainStep(Session& session, Optimizer& optimizer, Function function, TrainStepOptions options = {});
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // One step on a batch of one's own (on the session's device). The first call's shape is the step's: later
  // batches of that shape are copied into the step's buffers (device to device) and, once captured, replayed;
  // a batch of another shape (an epoch's shorter last batch) runs eagerly from the same state. The loss is read
  // (synchronising the stream) when `read_loss`, or when every step must be checked (skip_nonfinite, clipping).
  StepResult operator()(const Tensor& x, const Tensor& y, bool read_loss = false);
  // One step on a batch the caller writes into the step's buffers itself, saving operator()'s copy: `fill(x, y)`
  // gets x [rows, x_width] and y [rows, y_width] (float32, the session's device) to fill on the session's
  // stream (a replay buffer's draw). Rows other than the first call's run eagerly, as in operator().
  using Fill = std::function<void(const Tensor& x, const Tensor& y)>;
  StepResult fill_and_step(std::int64_t rows, std::int64_t x_width, std::int64_t y_width, const Fill& fill,
                           bool read_loss = false);
  // Waits for the steps queued so far; throws what refuse_nonfinite_samples found in them since the last wait.
  void synchronize();

  // Batches from a data set the runtime holds (data::ResidentDataset on the device, data::HostBatches): buffers
  // of `batch_rows` rows of `features` features are allocated once; next(rows) takes the source's next `rows`
  // rows (batch_rows, or fewer for an epoch's last batch, which runs eagerly). A captured step gathers the batch
  // after its own beside the update, when the source can (BatchSource::capturable).
  void use_source(data::BatchSource& source, std::int64_t batch_rows, std::int64_t features);
  StepResult next(std::int64_t rows, bool read_loss = false);

  // The optimizer's scalars for the next `count` steps under `schedule`, written once to the device
  // (Optimizer::plan_steps), so a replay needs no launch before it; only worth it for a step that will be
  // captured. The caller still applies the schedule before each step.
  void plan(const LrSchedule& schedule, std::int64_t count);

  // Why the step runs eagerly, "" while it is (or will be) captured. run_eagerly adds a reason of the caller's.
  const std::string& eager_reason() const { return eager_reason_; }
  void run_eagerly(const std::string& reason);
  bool captured() const { return graph_.captured(); }

 private:
  StepResult run(const Tensor& x, const Tensor& y, bool full, bool read_loss);
  StepResult replay(const Tensor& x, const Tensor& y, bool read_loss);
  StepResult eager(const Tensor& x, const Tensor& y, bool read_loss);
  bool capture(const Tensor& x, const Tensor& y);
  Tensor forward_backward(const Tensor& x, const Tensor& y);
  StepResult reject_nonfinite(const std::string& quantity, double local_value);
  StepResult read(const Tensor& loss, StepResult result);
  void update(const Stream& stream);
  void settle_vetoes();
  void refuse_if_vetoed();
  InvalidArgument refusal(std::int64_t word) const;
  void agree_on_veto();
  bool checks_on_device(const Tensor& x, const Tensor& y) const;
  void make_veto();
  void plan_if_vetoed();
  void point_sources_at(const Tensor& x, const Tensor& y);
  void stage(const Tensor& x, const Tensor& y);
  bool replays_next(bool full) const;
  bool any_rank(bool value) const;
  void agree(const std::string& local_error, const std::string& what) const;
  std::string option(const std::string& name, const std::string& value) const;
  void say(const std::string& line) const;

  Session& session_;
  Optimizer& optimizer_;
  Function function_;
  TrainStepOptions options_;
  const Stream& stream_;
  data::BatchSource* source_ = nullptr;
  Tensor x_, y_;           // the step's buffers: what a captured graph reads
  std::string eager_reason_;
  CudaGraph graph_;
  Tensor graph_loss_;      // written by every replay
  std::int64_t eager_steps_ = 0;
  std::int64_t skipped_in_a_row_ = 0;
  // refuse_nonfinite_samples on the device: the first bad value's key (kernels' copy_samples_checked), which
  // vetoes the update, and the vetoes reported back (two int64 of host memory the device writes).
  Tensor veto_;
  std::shared_ptr<Storage> vetoes_;
  // The checked batch's staging copy reads its arrays from sources_ (two pointers on the device, last written for
  // staged_from_); a graph captured with it (graph_stages_) replays a step from the caller's arrays in one launch.
  Tensor sources_;
  const void* staged_from_[2] = {nullptr, nullptr};
  bool graph_stages_ = false;
  bool stage_in_graph_ = false;  // during a step: its batch is staged by the replay (or by its capture)
};

}  // namespace ddp
