// The training step (see train_step.h): eager or replayed, the non-finite policy, clipping and the update.
#include "runtime/training/train_step.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/data/finite_samples.h"
#include "runtime/kernels/dispatch.h"
#include "runtime/optim/clip_grad.h"

namespace ddp {

TrainStep::TrainStep(Session& session, Optimizer& optimizer, Function function, TrainStepOptions options)
    : session_(session),
      optimizer_(optimizer),
      function_(std::move(function)),
      options_(std::move(options)),
      stream_(session.stream()) {
  if (!function_) throw InvalidArgument("TrainStep: no step function given");
  if (!options_.cuda_graph) {
    eager_reason_ = option("cuda_graph", "false");
  } else if (!session_.device().is_cuda()) {
    eager_reason_ = "the CPU has no graphs";
  } else if (session_.backend() != Backend::kNccl) {
    eager_reason_ = "the MPI backend stages through the host";
  } else if (options_.skip_nonfinite) {
    eager_reason_ = option("skip_nonfinite", "") + " reads every loss on the host";
  } else if (options_.clip_grad_norm > 0) {
    eager_reason_ = option("clip_grad_norm", "") + " reads every gradient norm on the host";
  }
}

void TrainStep::run_eagerly(const std::string& reason) {
  if (eager_reason_.empty()) eager_reason_ = reason;
}

void TrainStep::use_source(data::BatchSource& source, std::int64_t batch_rows, std::int64_t features) {
  if (batch_rows <= 0 || features <= 0) {
    throw InvalidArgument("TrainStep::use_source: a batch needs rows and features, got " + std::to_string(batch_rows) +
                          " rows of " + std::to_string(features));
  }
  source_ = &source;
  x_ = Tensor::empty({batch_rows, features}, DType::kFloat32, session_.device(), stream_);
  y_ = source.empty_y(batch_rows, stream_);
  if (!source.capturable()) run_eagerly("the training set is copied from host memory at each step");
}

void TrainStep::plan(const LrSchedule& schedule, std::int64_t count) {
  if (eager_reason_.empty() && count > 0) optimizer_.plan_steps(schedule, count, stream_);
}

StepResult TrainStep::operator()(const Tensor& x, const Tensor& y, bool read_loss) {
  if (source_ != nullptr) {
    throw InvalidArgument("TrainStep: this step takes its batches from its source (use_source); call next(rows)");
  }
  if (!x_.defined()) {
    x_ = Tensor::empty(x.shape(), x.dtype(), session_.device(), stream_);
    y_ = Tensor::empty(y.shape(), y.dtype(), session_.device(), stream_);
  }
  const bool full = x.shape() == x_.shape() && x.dtype() == x_.dtype() && y.shape() == y_.shape() &&
                    y.dtype() == y_.dtype();
  const bool device_check = options_.refuse_nonfinite_samples && checks_on_device(x, y);
  if (options_.refuse_nonfinite_samples && !device_check) {
    data::finite_samples(x, y, data::NonFinitePolicy::kRefuse, stream_);  // throws, naming the sample
  }
  if (device_check) {
    make_veto();
    point_sources_at(x, y);
  }
  if (!full) {
    if (!device_check) return run(x, y, false, read_loss);
    // Checked into buffers of its own shape, from which it runs eagerly.
    const Tensor cx = Tensor::empty(x.shape(), x.dtype(), session_.device(), stream_);
    const Tensor cy = Tensor::empty(y.shape(), y.dtype(), session_.device(), stream_);
    stage(cx, cy);
    return run(cx, cy, false, read_loss);
  }
  if (device_check) {
    // A captured step that stages its batch itself is one launch; otherwise the batch is staged here.
    stage_in_graph_ = replays_next(true) && (!graph_.captured() || graph_stages_);
    if (!stage_in_graph_) stage(x_, y_);
  } else {
    if (x.data_ptr() != x_.data_ptr()) x_.copy_from(x, stream_);
    if (y.data_ptr() != y_.data_ptr()) y_.copy_from(y, stream_);
    if (graph_stages_) point_sources_at(x_, y_);  // the graph's staging then copies the buffers onto themselves
  }
  StepResult result = run(x_, y_, true, read_loss);
  stage_in_graph_ = false;
  return result;
}

// Whether the batch x, y is checked on the device as it is copied in: float32 matrices of the step's widths (the
// veto word's key counts values in rows of those widths). Any other batch is checked on the host.
bool TrainStep::checks_on_device(const Tensor& x, const Tensor& y) const {
  const auto matrix = [](const Tensor& t) { return t.dtype() == DType::kFloat32 && t.dim() == 2; };
  return matrix(x) && matrix(y) && matrix(x_) && matrix(y_) && x.size(1) == x_.size(1) && y.size(1) == y_.size(1);
}

// The veto word and the host memory its reports land in, made once.
void TrainStep::make_veto() {
  if (veto_.defined()) return;
  veto_ = Tensor::from_host(&kernels::kNoVeto, {1}, DType::kInt64, session_.device(), stream_);
  vetoes_ = Storage::allocate_pinned(2 * sizeof(std::int64_t), stream_);
  static_cast<volatile std::int64_t*>(vetoes_->data())[1] = 0;
  sources_ = Tensor::zeros({2}, DType::kInt64, session_.device(), stream_);
}

// The arrays the staging copy reads (kernels' copy_samples_checked), written on the stream when they change.
void TrainStep::point_sources_at(const Tensor& x, const Tensor& y) {
  if (x.data_ptr() == staged_from_[0] && y.data_ptr() == staged_from_[1]) return;
  staged_from_[0] = x.data_ptr();
  staged_from_[1] = y.data_ptr();
  const std::int64_t pointers[2] = {reinterpret_cast<std::int64_t>(staged_from_[0]),
                                    reinterpret_cast<std::int64_t>(staged_from_[1])};
  sources_.copy_from(Tensor::from_host(pointers, {2}, DType::kInt64, Device::cpu(), cpu_stream()), stream_);
}

// The batch from the arrays sources_ points at into x and y (the step's buffers, or an odd batch's own), checked
// on the way.
void TrainStep::stage(const Tensor& x, const Tensor& y) {
  const std::int64_t ranks = options_.ranks_step_together ? session_.size() : 1;
  const std::int64_t rank = options_.ranks_step_together ? session_.rank() : 0;
  DDP_DISPATCH(session_.device(), copy_samples_checked, static_cast<const float* const*>(sources_.data_ptr()),
               x.size(0), x.size(1), y.size(1), ranks, rank, x.data<float>(), y.data<float>(),
               veto_.data<std::int64_t>(), stream_.handle());
}

bool TrainStep::replays_next(bool full) const {
  return full && eager_reason_.empty() && eager_steps_ >= options_.eager_steps;
}

StepResult TrainStep::fill_and_step(std::int64_t rows, std::int64_t x_width, std::int64_t y_width, const Fill& fill,
                                    bool read_loss) {
  if (source_ != nullptr) {
    throw InvalidArgument("TrainStep: this step takes its batches from its source (use_source); call next(rows)");
  }
  const auto buffer = [&](std::int64_t width) {
    return Tensor::empty({rows, width}, DType::kFloat32, session_.device(), stream_);
  };
  if (!x_.defined()) {
    x_ = buffer(x_width);
    y_ = buffer(y_width);
  }
  const bool full = x_.shape() == Shape{rows, x_width} && y_.shape() == Shape{rows, y_width} &&
                    x_.dtype() == DType::kFloat32 && y_.dtype() == DType::kFloat32;
  const Tensor x = full ? x_ : buffer(x_width);
  const Tensor y = full ? y_ : buffer(y_width);
  fill(x, y);
  if (full && graph_stages_) point_sources_at(x_, y_);  // the graph's staging then copies the buffers onto themselves
  return run(x, y, full, read_loss);
}

void TrainStep::synchronize() {
  stream_.synchronize();
  settle_vetoes();
}

// The batches the device refused since the last wait (the stream has run them): their steps did not happen.
void TrainStep::settle_vetoes() {
  if (vetoes_ == nullptr) return;
  volatile std::int64_t* report = static_cast<volatile std::int64_t*>(vetoes_->data());
  const std::int64_t refused = report[1], first = report[0];
  if (refused == 0) return;
  report[1] = 0;
  optimizer_.forget_vetoed_steps(refused);
  const InvalidArgument error = refusal(first);
  if (refused == 1) throw error;
  throw InvalidArgument(std::to_string(refused) + " batches since the last wait were refused, none of them applied; " +
                        "the first: " + error.what());
}

// A vetoed update takes its scalars from a plan: one at the current learning rate, made again when it runs out
// or the rate changes (in place, so a captured step keeps reading it).
void TrainStep::plan_if_vetoed() {
  constexpr std::int64_t kPlannedSteps = 1024;
  if (vetoes_ != nullptr && !optimizer_.plan_covers_next_step()) {
    optimizer_.plan_steps(ConstantLr(optimizer_.lr()), kPlannedSteps, stream_);
  }
}

// In an eager step that reads its loss: this batch's veto, read before the update would report it.
void TrainStep::refuse_if_vetoed() {
  const std::int64_t first = veto_.to_vector<std::int64_t>(stream_)[0];
  if (first == kernels::kNoVeto) return;
  veto_.copy_from(Tensor::from_host(&kernels::kNoVeto, {1}, DType::kInt64, session_.device(), stream_), stream_);
  autograd::clear_tape();
  throw refusal(first);
}

// The refusal of the batch whose first value not finite has the veto word `word` (kernels' copy_samples_checked:
// the key row · (x's width + y's) + column, and the rank when the ranks step together).
InvalidArgument TrainStep::refusal(std::int64_t word) const {
  const std::int64_t ranks = options_.ranks_step_together ? session_.size() : 1;
  const std::int64_t a = x_.size(1), width = a + y_.size(1), key = word / ranks, rank = word % ranks;
  const InvalidArgument error = data::nonfinite_sample_error(key / width, key % width, a);
  if (ranks == 1) return error;
  return InvalidArgument("rank " + std::to_string(rank) + "'s batch (no rank took the step): " + error.what());
}

// Stepping together, every rank takes the smallest veto word of all (none when no rank vetoes), so that all skip
// the same updates; in stream order, before anything reads it.
void TrainStep::agree_on_veto() {
  if (vetoes_ == nullptr || !options_.ranks_step_together || session_.size() == 1) return;
  session_.group().all_reduce(CommBuffer::of(veto_), ReduceOp::kMin, stream_)->wait(stream_);
}

// The optimizer's update, vetoed on the device when the batch was checked there.
void TrainStep::update(const Stream& stream) {
  if (vetoes_ == nullptr) {
    optimizer_.apply_step(stream);
    return;
  }
  optimizer_.apply_step(stream, veto_.data<std::int64_t>(), static_cast<std::int64_t*>(vetoes_->data()));
}

StepResult TrainStep::next(std::int64_t rows, bool read_loss) {
  if (source_ == nullptr) throw InvalidArgument("TrainStep::next: no source; call use_source first");
  const std::int64_t batch_rows = x_.size(0);
  if (rows <= 0 || rows > batch_rows) {
    throw InvalidArgument("TrainStep::next: " + std::to_string(rows) + " rows asked of a step of batches of " +
                          std::to_string(batch_rows));
  }
  const bool full = rows == batch_rows;
  const Tensor x = full ? x_ : x_.slice_rows(0, rows);
  const Tensor y = full ? y_ : y_.slice_rows(0, rows);
  // Already in the buffers when the replay before this step prefetched it, else gathered here.
  if (!source_->take_prefetched(rows)) source_->gather_next(x, y, stream_);
  return run(x, y, full, read_loss);
}

StepResult TrainStep::run(const Tensor& x, const Tensor& y, bool full, bool read_loss) {
  if (!replays_next(full)) return eager(x, y, read_loss);
  // A replay takes the update's scalars from device memory, which prepare_step fills (or a plan holds).
  if (!optimizer_.device_scalars()) optimizer_.use_device_scalars(stream_);
  plan_if_vetoed();
  optimizer_.prepare_step(stream_);
  StepResult result;
  Tensor loss;
  if (graph_.captured() || capture(x, y)) {
    graph_.replay(stream_);
    loss = graph_loss_;
    result.replayed = true;
  } else {
    // Every rank goes on eagerly, from the step prepared above.
    if (stage_in_graph_) stage(x_, y_);
    loss = forward_backward(x, y);
    update(stream_);
  }
  if (!read_loss) return result;
  // Reading the loss waits for the step: only when asked. The update is done; a non-finite loss ends the run.
  return read(loss, result);
}

StepResult TrainStep::read(const Tensor& loss, StepResult result) {
  const double value = loss.item(stream_);
  settle_vetoes();
  if (any_rank(!std::isfinite(value))) return reject_nonfinite("loss", value);
  result.loss_read = true;
  result.loss = value;
  result.mean_loss = options_.ranks_step_together ? session_.mean(value) : value;
  return result;
}

bool TrainStep::any_rank(bool value) const { return options_.ranks_step_together ? session_.any(value) : value; }

// `local_error` ("" for none) on this rank ends the step on every rank that steps with it.
void TrainStep::agree(const std::string& local_error, const std::string& what) const {
  if (options_.ranks_step_together) {
    session_.agree(local_error, what);
  } else if (!local_error.empty()) {
    throw Error(what + ": " + local_error);
  }
}

StepResult TrainStep::eager(const Tensor& x, const Tensor& y, bool read_loss) {
  const Tensor loss = forward_backward(x, y);
  StepResult result;
  // The loss of a refused batch is no divergence: the refusal comes first.
  if (vetoes_ != nullptr && (read_loss || options_.skip_nonfinite || options_.clip_grad_norm > 0)) refuse_if_vetoed();
  if (read_loss || options_.skip_nonfinite) {
    // Reading the loss synchronises: only when asked, or when every step must be checked.
    result = read(loss, result);
    if (!result.taken) return result;
  }
  if (options_.clip_grad_norm > 0) {
    // Every rank holds the same averaged gradients, so every rank gets the same norm and decides alike.
    result.grad_norm = clip_grad_norm(optimizer_.store(), options_.clip_grad_norm, stream_);
    if (!std::isfinite(result.grad_norm)) return reject_nonfinite("gradient norm", result.grad_norm);
  }
  if (vetoes_ == nullptr) {
    optimizer_.step(stream_);
  } else {
    plan_if_vetoed();
    optimizer_.step(stream_, veto_.data<std::int64_t>(), static_cast<std::int64_t*>(vetoes_->data()));
  }
  ++eager_steps_;
  skipped_in_a_row_ = 0;
  return result;
}

Tensor TrainStep::forward_backward(const Tensor& x, const Tensor& y) {
  if (options_.zero_grad) optimizer_.zero_grad(stream_);
  Tensor loss = function_(x, y);
  if (!loss.defined() || loss.numel() != 1 || loss.dtype() != DType::kFloat32) {
    autograd::clear_tape();
    throw InvalidArgument("the step function must return its loss, a float32 tensor of one element; it returned " +
                          (loss.defined() ? loss.describe() : std::string("an undefined tensor")));
  }
  agree_on_veto();
  return loss;
}

// The whole step captured as one graph: forward, backward with its all-reduces, the update (its scalars from the
// optimizer's device slot or plan, which prepare_step fills before each replay) and, beside the update once
// backward has read x for the last time, the next batch's gather from the source's cursor. The eager steps
// before it filled the allocator's cache and cuBLASLt's plans, so the capture allocates nothing.
bool TrainStep::capture(const Tensor& x, const Tensor& y) {
  graph_stages_ = stage_in_graph_;
  graph_ = CudaGraph::capture(stream_, [&] {
    if (graph_stages_) stage(x_, y_);
    graph_loss_ = forward_backward(x, y);
    if (source_ != nullptr) source_->prefetch_next(x, y, stream_);
    update(stream_);
    if (source_ != nullptr) source_->join_prefetch(stream_);
  });
  if (!graph_.captured()) {
    autograd::clear_tape();
    graph_stages_ = false;
  }
  // All ranks replay or none do: a rank stepping eagerly beside graphs would still issue the same collectives,
  // but a failed capture may have left NCCL calls behind that the others never see.
  if (!any_rank(!graph_.captured())) return true;
  const std::string error = graph_.error();
  eager_reason_ = graph_.captured() ? "another rank could not capture it" : error;
  graph_ = CudaGraph();
  if (!options_.eager_if_capture_fails) {
    agree(error.empty() ? "" : error + "; " + option("cuda_graph", "false") + " runs the step eagerly",
          "the training step cannot be captured as a CUDA graph");
  }
  say("CUDA graph off (" + eager_reason_ + "): eager steps from here; " + option("cuda_graph", "false") +
      " skips the attempt");
  return false;
}

// Called on every rank when `quantity` is not finite on some rank at the step being taken: without
// skip_nonfinite the job ends with one message naming the ranks; with it the step is skipped.
StepResult TrainStep::reject_nonfinite(const std::string& quantity, double local_value) {
  const std::string at = " at step " + std::to_string(optimizer_.steps() + 1);
  if (!options_.skip_nonfinite) {
    agree(std::isfinite(local_value) ? ""
                                     : "the " + quantity + " is " + std::to_string(local_value) + at +
                                           " (lower the learning rate, or set " + option("skip_nonfinite", "true") +
                                           " to skip such steps)",
          "training diverged");
  }
  say("skipping step " + std::to_string(optimizer_.steps() + 1) + ": the " + quantity + " is not finite");
  // Once the parameters themselves are not finite every step is skipped: a bound instead of a run that ends
  // 'successfully' with nothing learnt.
  ++skipped_in_a_row_;
  agree(skipped_in_a_row_ < options_.skip_nonfinite_limit
            ? ""
            : std::to_string(skipped_in_a_row_) + " batches in a row gave a non-finite " + quantity + at +
                  " and were skipped (the parameters are probably no longer finite): lower the learning rate, " +
                  "or raise " + option("skip_nonfinite_limit", ""),
        "training diverged");
  StepResult result;
  result.taken = false;
  return result;
}

std::string TrainStep::option(const std::string& name, const std::string& value) const {
  if (options_.option_name) return options_.option_name(name, value);
  return "TrainStepOptions::" + name + (value.empty() ? "" : " = " + value);
}

void TrainStep::say(const std::string& line) const {
  if (!session_.is_lead()) return;
  if (options_.say) {
    options_.say(line);
    return;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace ddp
