// Optimizers over a ParameterStore's flat buffers: SGD (momentum, dampening, Nesterov, weight decay) and
// AdamW, with torch.optim's update rules.
//
// Why flat: parameters, gradients and optimizer state are each one contiguous float32 buffer in the same
// layout, so step() is ONE kernel call (kernels::{cpu,cuda}::sgd_step / adamw_step) over every parameter, on
// the stream passed in, with no host synchronisation. State buffers are in the store's layout; an optimizer made
// before the store is re-laid out (DistributedDataParallel does it) follows the new layout until its first step
// and refuses, saying so, after it.
//
// Sharded (ZeRO stage 1): when the store carries an OptimizerShard (DistributedDataParallel with
// DdpOptions::shard_optimizer), the optimizer keeps state for this rank's spans of the flat buffers only and
// runs its kernel over each of them, telling the shard after each (which hands the updated span to the other
// ranks while the next one is updated), then waits for the other ranks' spans. The arithmetic per element is
// the same as unsharded, so the parameters are the same bits given the same gradients.
//
//   ddp::AdamW optimizer(model, {.lr = 1e-3}, stream);   // before or after DistributedDataParallel
//   ... ddp_model.backward(loss); optimizer.step(stream);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/phase.h"
#include "runtime/core/stream.h"
#include "runtime/models/module.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class GradientGate;    // runtime/autograd/gradient_gate.h
class OptimizerShard;  // runtime/autograd/optimizer_shard.h

class LrSchedule;

class Optimizer {
 public:
  explicit Optimizer(ParameterStore& store) : store_(store), layout_version_(store.layout_version()) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its current gradient: prepare_step, then apply_step. Enqueued on
  // `stream` (the stream backward ran on, or one ordered after it); the host does not wait. Throws
  // InvalidArgument when the parameters were re-laid out after an earlier step (see the top of this file).
  // Refused inside a CUDA graph capture: prepare_step's host work would happen once, at the capture, not at each
  // replay (a captured TrainStep updates with its optimizer itself).
  void step(const Stream& stream = current_stream());
  // The two halves of a step, for CUDA graphs. prepare_step counts the step and derives its scalars (learning
  // rate, bias corrections) on the host; apply_step is the one update kernel. After use_device_scalars(),
  // prepare_step also writes the scalars into device memory (one small launch, no host wait) and apply_step
  // reads them there, so a graph can capture apply_step once and replay it after each prepare_step.
  void prepare_step(const Stream& stream);
  void apply_step(const Stream& stream);
  void use_device_scalars(const Stream& stream);
  bool device_scalars() const { return device_scalars_.defined(); }
  // One step further for graphs: the scalars of the next `count` steps under `schedule` are computed here once
  // (on the host, as prepare_step would) into a table in device memory, and apply_step takes the next row itself
  // (one small kernel that a graph captures with the update), so a replay needs no launch before it; prepare_step
  // then only counts the step and checks that the learning rate is the one planned (the caller still applies
  // the schedule, as for any step). Implies use_device_scalars. A step past the plan, or another learning rate,
  // is an error; planning again (after a resume, say) starts a new plan at the current step.
  void plan_steps(const LrSchedule& schedule, std::int64_t count, const Stream& stream);
  bool planned() const { return plan_table_.defined(); }
  // Whether the plan holds the next step at the current learning rate.
  bool plan_covers_next_step() const;
  // apply_step under a veto, for a step whose batch is checked on the device and may not wait for the host
  // (kernels' take_next_row): when *veto (int64 on the store's device) is set at the update, the update leaves
  // the parameters and the state as they were, the veto is added to report[0..1] (host memory the device writes,
  // read after the stream) and cleared, and the plan's row is left for the next step. Needs a plan covering the
  // step. The host learns of a vetoed step after the stream; forget_vetoed_steps then takes it off the count.
  void apply_step(const Stream& stream, std::int64_t* veto, std::int64_t* report);
  // step() under such a veto: prepare_step, then the apply_step above.
  void step(const Stream& stream, std::int64_t* veto, std::int64_t* report);
  void forget_vetoed_steps(std::int64_t count) { steps_ -= count; }
  void zero_grad(const Stream& stream = current_stream()) { store_.zero_grad(stream); }

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  // Updates done so far (PyTorch's `step` in the state).
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }  // when resuming from a checkpoint
  // Named flat state buffers, for checkpoints: the spans state_spans() of the store's layout, packed in order.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  ParameterStore& store() const { return store_; }
  // The spans of the flat buffers this optimizer updates and keeps state for, in flat order; span k's state
  // starts at the sum of the counts of spans 0..k-1. The whole buffer (one span) unless sharded. Follows a
  // new layout of the store at the next prepare_step.
  const std::vector<FlatSpan>& state_spans() const { return spans_; }
  // The store's OptimizerShard this optimizer's state is made for, or null (unsharded).
  OptimizerShard* shard() const { return shard_.get(); }
  bool sharded() const { return shard_ != nullptr; }

  // Mixed precision: every step() also writes bfloat16(updated parameters) into `copy`, a flat bfloat16
  // tensor laid out as the store (Bf16Weights::flat()), in the same pass over memory instead of a cast pass
  // of its own. An undefined tensor turns it off.
  void set_bf16_copy(const Tensor& copy);

 protected:
  void* bf16_copy_data() const { return bf16_copy_.defined() ? bf16_copy_.data_ptr() : nullptr; }
  // Follows a new layout of the store (DistributedDataParallel lays the parameters out in bucket order): state
  // that no step has touched yet is zero in any layout and is made again in the new one; state a step has
  // written cannot follow, and the call says how to order the construction instead. Called by prepare_step.
  void follow_store_layout(const Stream& stream);
  // Takes the store's current layout and shard: the spans to update, then make_state.
  void adopt_store_layout(const Stream& stream);
  // Allocates the state buffers, zero, for state_numel() elements.
  virtual void make_state(const Stream& stream) = 0;
  // The device scalars of the step after `steps` steps (0-based) at learning rate `lr`, as bytes: what prepare_step
  // would write for it. For plan_steps.
  virtual std::size_t scalars_bytes() const = 0;
  virtual void scalars_of_step(std::int64_t steps, double lr, void* out) const = 0;
  // The step after `steps` steps at learning rate `lr`: its scalars written to `device_scalars` (on the store's
  // device, in stream order: the kind's write_*_scalars kernel), and its update kernels over the owned spans,
  // reading the scalars from `device_scalars` when not null (a captured update), else from the arguments.
  virtual void write_scalars(std::int64_t steps, double lr, void* device_scalars, const Stream& stream) const = 0;
  virtual void update(std::int64_t steps, double lr, const void* device_scalars, const Stream& stream) = 0;
  // In prepare_step: true when the step's scalars come from the plan (after checking it covers this step).
  bool step_is_planned() const;
  // In apply_step: the plan's next row into the device scalars, in stream order before the update reads them.
  void take_planned_scalars(const Stream& stream, std::int64_t* veto = nullptr, std::int64_t* report = nullptr);
  std::int64_t state_numel() const;
  // apply_step's loop: `update(span, state_offset)` queues the kernel over one owned span; sharded, the shard
  // hears of each span as soon as it is queued and, after the last, the stream waits for the other ranks' spans
  // (whose bf16 copy, if any, is then refreshed from the gathered parameters).
  void update_spans(const Stream& stream, const std::function<void(const FlatSpan&, std::int64_t)>& update);
  // update_spans under the store's gradient gate: piece by piece, each after its own gradients are final.
  void update_behind_gate(GradientGate& gate, const Stream& stream,
                          const std::function<void(const FlatSpan&, std::int64_t)>& update);

  ParameterStore& store_;
  Tensor bf16_copy_;
  static constexpr std::size_t kDeviceScalarBytes = 64;
  Tensor device_scalars_;  // kDeviceScalarBytes on the store's device, or undefined
  double lr_ = 0.0;  // double, as PyTorch's hyperparameters
  std::int64_t steps_ = 0;
  Tensor plan_table_;                // rows of scalars_bytes() on the store's device, or undefined
  Tensor plan_next_;                 // [1] int64 on the device: the row apply_step takes next
  std::vector<double> plan_lr_;      // the learning rate of each row, for prepare_step's check
  std::int64_t plan_first_step_ = 0;
  std::int64_t layout_version_;  // the store's layout the state buffers are in
  std::shared_ptr<OptimizerShard> shard_;  // kept alive with the state made for it
  std::vector<FlatSpan> spans_;   // updated here, in flat order
  std::vector<FlatSpan> others_;  // the rest of the flat buffer (sharded): updated by the other ranks

 private:
  // The step prepare_step prepared (steps before it, its learning rate, its scalars' device slot or null), for
  // apply_step.
  std::int64_t prepared_steps_ = 0;
  double prepared_lr_ = 0.0;
  void* prepared_device_scalars_ = nullptr;
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD: g = grad + wd·p; with momentum, buf = g on the first step, else μ·buf + (1−dampening)·g;
// the update is g + μ·buf (Nesterov) or buf; p −= lr·update.
class Sgd : public Optimizer {
 public:
  // Over `model`'s parameters (flattened here when the model is not yet) or a store; the state is allocated
  // on `stream`. InvalidArgument for negative hyperparameters or Nesterov without momentum.
  Sgd(Module& model, const SgdOptions& options, const Stream& stream = current_stream())
      : Sgd(model.flat_parameters(stream), options, stream) {}
  Sgd(ParameterStore& store, const SgdOptions& options, const Stream& stream = current_stream());
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const SgdOptions& options() const { return options_; }

 private:
  void make_state(const Stream& stream) override;
  std::size_t scalars_bytes() const override;
  void scalars_of_step(std::int64_t steps, double lr, void* out) const override;
  void write_scalars(std::int64_t steps, double lr, void* device_scalars, const Stream& stream) const override;
  void update(std::int64_t steps, double lr, const void* device_scalars, const Stream& stream) override;
  SgdOptions options_;
  Tensor momentum_;  // [state_numel()] or undefined without momentum
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// torch.optim.AdamW (amsgrad off): p *= 1 − lr·wd; m, v updated; p −= lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) + eps).
class AdamW : public Optimizer {
 public:
  // Over `model`'s parameters (flattened here when the model is not yet) or a store; the state is allocated
  // on `stream`. InvalidArgument for a negative lr or eps, or betas outside [0, 1).
  AdamW(Module& model, const AdamWOptions& options, const Stream& stream = current_stream())
      : AdamW(model.flat_parameters(stream), options, stream) {}
  AdamW(ParameterStore& store, const AdamWOptions& options, const Stream& stream = current_stream());
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const AdamWOptions& options() const { return options_; }

 private:
  void make_state(const Stream& stream) override;
  std::size_t scalars_bytes() const override;
  void scalars_of_step(std::int64_t steps, double lr, void* out) const override;
  void write_scalars(std::int64_t steps, double lr, void* device_scalars, const Stream& stream) const override;
  void update(std::int64_t steps, double lr, const void* device_scalars, const Stream& stream) override;
  AdamWOptions options_;
  Tensor exp_avg_, exp_avg_sq_;
};

// ---- Learning-rate schedules: lr as a function of the 0-based step about to be taken ----
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(std::int64_t step) const = 0;
  // Sets optimizer.lr() for its next step.
  void apply(Optimizer& optimizer) const { optimizer.set_lr(lr_at(optimizer.steps())); }
};

class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lr_at(std::int64_t) const override { return lr_; }

 private:
  double lr_;
};

// Linear warmup from base/warmup to base over `warmup_steps` steps (step s < warmup gets base·(s+1)/warmup),
// then cosine decay from base to `min_lr` at `total_steps`; min_lr afterwards.
class CosineWithWarmup : public LrSchedule {
 public:
  CosineWithWarmup(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr = 0.0);
  double lr_at(std::int64_t step) const override;

 private:
  double base_, min_;
  std::int64_t warmup_, total_;
};

}  // namespace ddp
