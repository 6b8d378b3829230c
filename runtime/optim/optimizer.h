// Optimizers over a ParameterStore's flat buffers: SGD (momentum, dampening, Nesterov, weight decay) and
// AdamW, with torch.optim's update rules.
//
// Why flat: parameters, gradients and optimizer state are each one contiguous float32 buffer in the same
// layout, so step() is ONE kernel call (kernels::{cpu,cuda}::sgd_step / adamw_step) over every parameter, on
// the stream passed in, with no host synchronisation. State buffers are in the store's layout; an optimizer made
// before the store is re-laid out (DistributedDataParallel does it) follows the new layout until its first step
// and refuses, saying so, after it.
//
//   ddp::AdamW optimizer(model, {.lr = 1e-3}, stream);   // before or after DistributedDataParallel
//   ... ddp_model.backward(loss); optimizer.step(stream);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/module.h"
#include "runtime/kernels/kernels.h"
#include "runtime/autograd/parameter_store.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class Optimizer {
 public:
  explicit Optimizer(ParameterStore& store) : store_(store), layout_version_(store.layout_version()) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its current gradient: prepare_step, then apply_step. Enqueued on
  // `stream` (the stream backward ran on, or one ordered after it); the host does not wait. Throws
  // InvalidArgument when the parameters were re-laid out after an earlier step (see the top of this file).
  void step(const Stream& stream) {
    prepare_step(stream);
    apply_step(stream);
  }
  // The two halves of a step, for CUDA graphs. prepare_step counts the step and derives its scalars (learning
  // rate, bias corrections) on the host; apply_step is the one update kernel. After use_device_scalars(),
  // prepare_step also writes the scalars into device memory (one small launch, no host wait) and apply_step
  // reads them there, so a graph can capture apply_step once and replay it after each prepare_step.
  virtual void prepare_step(const Stream& stream) = 0;
  virtual void apply_step(const Stream& stream) = 0;
  void use_device_scalars(const Stream& stream);
  bool device_scalars() const { return device_scalars_.defined(); }
  void zero_grad(const Stream& stream) { store_.zero_grad(stream); }

  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  // Updates done so far (PyTorch's `step` in the state).
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps) { steps_ = steps; }  // when resuming from a checkpoint
  // Named flat state buffers (same layout as the store), for checkpoints.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  ParameterStore& store() const { return store_; }

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
  // Allocates the state buffers, zero, in the store's current layout.
  virtual void make_state(const Stream& stream) = 0;
  template <typename Scalars>
  Scalars* device_scalars_as() const {
    static_assert(sizeof(Scalars) <= kDeviceScalarBytes, "the step's scalars must fit the device slot");
    return device_scalars_.defined() ? static_cast<Scalars*>(device_scalars_.data_ptr()) : nullptr;
  }

  ParameterStore& store_;
  Tensor bf16_copy_;
  static constexpr std::size_t kDeviceScalarBytes = 64;
  Tensor device_scalars_;  // kDeviceScalarBytes on the store's device, or undefined
  double lr_ = 0.0;  // double, as PyTorch's hyperparameters
  std::int64_t steps_ = 0;
  std::int64_t layout_version_;  // the store's layout the state buffers are in
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
  Sgd(Module& model, const SgdOptions& options, const Stream& stream)
      : Sgd(model.flat_parameters(stream), options, stream) {}
  Sgd(ParameterStore& store, const SgdOptions& options, const Stream& stream);
  void prepare_step(const Stream& stream) override;
  void apply_step(const Stream& stream) override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const SgdOptions& options() const { return options_; }

 private:
  void make_state(const Stream& stream) override;
  SgdOptions options_;
  Tensor momentum_;  // [total] or undefined without momentum
  kernels::SgdParams prepared_{};
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
  AdamW(Module& model, const AdamWOptions& options, const Stream& stream)
      : AdamW(model.flat_parameters(stream), options, stream) {}
  AdamW(ParameterStore& store, const AdamWOptions& options, const Stream& stream);
  void prepare_step(const Stream& stream) override;
  void apply_step(const Stream& stream) override;
  std::vector<std::pair<std::string, Tensor>> state() const override;
  const AdamWOptions& options() const { return options_; }

 private:
  void make_state(const Stream& stream) override;
  AdamWOptions options_;
  Tensor exp_avg_, exp_avg_sq_;
  kernels::AdamWParams prepared_{};
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
