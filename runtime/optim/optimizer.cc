// SGD and AdamW steps (one fused kernel each) and the LR schedules.
#include "runtime/optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "runtime/autograd/gradient_gate.h"
#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/kernels/dispatch.h"

namespace ddp {

void Optimizer::set_bf16_copy(const Tensor& copy) {
  if (copy.defined()) {
    DDP_CHECK(copy.dtype() == DType::kBFloat16 && copy.numel() == store_.total_numel() &&
                  copy.device() == store_.device(),
              "Optimizer::set_bf16_copy: need a bfloat16 tensor of " + std::to_string(store_.total_numel()) +
                  " elements on the store's device, got " + copy.describe());
  }
  bf16_copy_ = copy;
}

void Optimizer::step(const Stream& stream) { step(stream, nullptr, nullptr); }

void Optimizer::step(const Stream& stream, std::int64_t* veto, std::int64_t* report) {
  if (is_capturing(stream)) {
    throw InvalidArgument(
        "optimizer.step() inside a captured step: its learning rate and step count would be fixed at the capture; "
        "leave the update to the TrainStep, which steps the optimizer it was given after the step function");
  }
  PhaseGuard phase(Phase::kOptimizer);
  prepare_step(stream);
  if (veto == nullptr) {
    apply_step(stream);
  } else {
    apply_step(stream, veto, report);
  }
}

void Optimizer::prepare_step(const Stream& stream) {
  follow_store_layout(stream);
  prepared_steps_ = steps_;
  prepared_lr_ = lr_;
  prepared_device_scalars_ = device_scalars_.defined() ? device_scalars_.data_ptr() : nullptr;
  if (prepared_device_scalars_ != nullptr && !step_is_planned()) {
    write_scalars(prepared_steps_, prepared_lr_, prepared_device_scalars_, stream);
  }
  ++steps_;
}

void Optimizer::apply_step(const Stream& stream) {
  if (planned()) take_planned_scalars(stream);
  update(prepared_steps_, prepared_lr_, prepared_device_scalars_, stream);
}

void Optimizer::apply_step(const Stream& stream, std::int64_t* veto, std::int64_t* report) {
  DDP_CHECK(planned() && prepared_device_scalars_ != nullptr,
            "Optimizer::apply_step: a vetoed update takes its scalars from a plan (plan_steps before prepare_step)");
  take_planned_scalars(stream, veto, report);
  update(prepared_steps_, prepared_lr_, prepared_device_scalars_, stream);
}

void Optimizer::use_device_scalars(const Stream& stream) {
  if (device_scalars_.defined()) return;
  device_scalars_ = Tensor::zeros({static_cast<std::int64_t>(kDeviceScalarBytes / sizeof(std::int64_t))},
                                  DType::kInt64, store_.device(), stream);
}

void Optimizer::plan_steps(const LrSchedule& schedule, std::int64_t count, const Stream& stream) {
  DDP_CHECK(count > 0, "Optimizer::plan_steps: count must be positive, got " + std::to_string(count));
  use_device_scalars(stream);
  const std::size_t row = scalars_bytes();
  const auto words = static_cast<std::int64_t>((static_cast<std::size_t>(count) * row + 7) / 8);
  Tensor table = Tensor::zeros({words}, DType::kInt64, Device::cpu(), cpu_stream());
  auto* bytes = static_cast<unsigned char*>(table.data_ptr());
  plan_lr_.resize(static_cast<std::size_t>(count));
  for (std::int64_t k = 0; k < count; ++k) {
    plan_lr_[static_cast<std::size_t>(k)] = schedule.lr_at(steps_ + k);
    scalars_of_step(steps_ + k, plan_lr_[static_cast<std::size_t>(k)], bytes + static_cast<std::size_t>(k) * row);
  }
  const Stream& on = store_.device().is_cuda() ? stream : cpu_stream();
  if (plan_table_.defined() && plan_table_.numel() == words) {
    // In place, in stream order: a captured step holds the addresses of the table and of its cursor.
    plan_table_.copy_from(table, on);
    plan_next_.zero_(on);
  } else {
    plan_table_ = table.copy_to(store_.device(), on);
    plan_next_ = Tensor::zeros({1}, DType::kInt64, store_.device(), on);
  }
  plan_first_step_ = steps_;
}

bool Optimizer::plan_covers_next_step() const {
  if (!planned()) return false;
  const std::int64_t k = steps_ - plan_first_step_;
  return k < static_cast<std::int64_t>(plan_lr_.size()) && lr_ == plan_lr_[static_cast<std::size_t>(k)];
}

bool Optimizer::step_is_planned() const {
  if (!planned()) return false;
  const std::int64_t k = steps_ - plan_first_step_;
  DDP_CHECK(k < static_cast<std::int64_t>(plan_lr_.size()),
            "step " + std::to_string(steps_ + 1) + " is past the " + std::to_string(plan_lr_.size()) +
                " steps planned from step " + std::to_string(plan_first_step_ + 1) +
                " (Optimizer::plan_steps): plan more steps");
  DDP_CHECK(lr_ == plan_lr_[static_cast<std::size_t>(k)],
            "step " + std::to_string(steps_ + 1) + " has learning rate " + std::to_string(lr_) + " but " +
                std::to_string(plan_lr_[static_cast<std::size_t>(k)]) +
                " was planned (Optimizer::plan_steps): plan again after changing the schedule");
  return true;
}

void Optimizer::take_planned_scalars(const Stream& stream, std::int64_t* veto, std::int64_t* report) {
  DDP_DISPATCH(store_.device(), take_next_row, plan_table_.data_ptr(), static_cast<std::int64_t>(scalars_bytes()),
               plan_next_.data<std::int64_t>(), device_scalars_.data_ptr(), veto, report, stream.handle());
}

Sgd::Sgd(ParameterStore& store, const SgdOptions& options, const Stream& stream)
    : Optimizer(store), options_(options) {
  DDP_CHECK(options.lr >= 0.0f, "SGD: the learning rate (lr) must be >= 0, got " + std::to_string(options.lr));
  DDP_CHECK(options.momentum >= 0.0f, "SGD: momentum must be >= 0, got " + std::to_string(options.momentum));
  DDP_CHECK(options.weight_decay >= 0.0f, "SGD: weight_decay must be >= 0");
  DDP_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
            "SGD: Nesterov momentum requires momentum > 0 and dampening = 0 (as torch.optim.SGD)");
  lr_ = options.lr;
  adopt_store_layout(stream);
}

void Sgd::make_state(const Stream& stream) {
  if (options_.momentum != 0.0) {
    momentum_ = Tensor::zeros({state_numel()}, DType::kFloat32, store_.device(), stream);
  }
}

void Optimizer::adopt_store_layout(const Stream& stream) {
  shard_ = store_.shared_optimizer_shard();
  spans_.clear();
  others_.clear();
  if (shard_ == nullptr) {
    spans_.push_back({0, store_.total_numel()});
  } else {
    spans_ = shard_->owned();
    std::int64_t at = 0;
    for (const FlatSpan& s : spans_) {
      DDP_ASSERT(s.offset >= at && s.end() <= store_.total_numel(), "owned spans out of order or past the store");
      if (s.offset > at) others_.push_back({at, s.offset - at});
      at = s.end();
    }
    if (at < store_.total_numel()) others_.push_back({at, store_.total_numel() - at});
  }
  layout_version_ = store_.layout_version();
  make_state(stream);
}

std::int64_t Optimizer::state_numel() const {
  std::int64_t n = 0;
  for (const FlatSpan& s : spans_) n += s.count;
  return n;
}

void Optimizer::follow_store_layout(const Stream& stream) {
  if (layout_version_ == store_.layout_version()) return;
  if (steps_ > 0) {
    throw InvalidArgument("the optimizer has taken " + std::to_string(steps_) +
                          " step(s) in a layout of the parameters that has changed since (DistributedDataParallel "
                          "lays them out in bucket order when it is constructed): construct "
                          "DistributedDataParallel before stepping the optimizer");
  }
  adopt_store_layout(stream);
  DDP_CHECK(!bf16_copy_.defined() || bf16_copy_.numel() == store_.total_numel(),
            "the bf16 copy was made for an older layout of the parameters: make Bf16Weights after "
            "DistributedDataParallel, then set_bf16_copy");
}

void Optimizer::update_spans(const Stream& stream,
                             const std::function<void(const FlatSpan&, std::int64_t)>& update) {
  if (GradientGate* gate = store_.gradient_gate(); gate != nullptr && shard_ == nullptr) {
    update_behind_gate(*gate, stream, update);
    return;
  }
  std::int64_t state_offset = 0;
  for (std::size_t k = 0; k < spans_.size(); ++k) {
    update(spans_[k], state_offset);
    state_offset += spans_[k].count;
    if (shard_ != nullptr) shard_->span_updated(k, stream);
  }
  if (shard_ == nullptr) return;
  shard_->finish_update(stream);
  if (!bf16_copy_.defined()) return;
  // The other ranks' spans arrive in FP32; their bf16 copy is the same rounding the kernel does for our own.
  const float* params = store_.flat_params().data<float>();
  auto* copy = static_cast<std::uint16_t*>(bf16_copy_.data_ptr());
  for (const FlatSpan& s : others_) {
    DDP_DISPATCH(store_.device(), cast, DType::kFloat32, params + s.offset, DType::kBFloat16, copy + s.offset,
                 s.count, stream.handle());
  }
}

void Optimizer::update_behind_gate(GradientGate& gate, const Stream& stream,
                                   const std::function<void(const FlatSpan&, std::int64_t)>& update) {
  // Unsharded, the one span is the whole buffer and the state is laid out as it: piece k's state starts at its
  // offset. Each piece's update waits for that piece's gradients only.
  const std::vector<std::int64_t>& bounds = gate.boundaries();
  DDP_ASSERT(spans_.size() == 1 && spans_[0].offset == 0 && !bounds.empty() && bounds.back() == spans_[0].count,
             "a gradient gate's pieces must cover the optimizer's one span");
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    gate.wait_piece(k, stream);
    const FlatSpan piece{bounds[k], bounds[k + 1] - bounds[k]};
    if (piece.count > 0) update(piece, piece.offset);
  }
}

namespace {

// The kernel's parameters of the step after `steps` steps (0-based) at learning rate `lr`.
kernels::SgdParams sgd_params(const SgdOptions& options, std::int64_t steps, double lr) {
  kernels::SgdParams p{};
  p.lr = lr;
  p.momentum = options.momentum;
  p.dampening = options.dampening;
  p.weight_decay = options.weight_decay;
  p.nesterov = options.nesterov;
  p.first_step = steps == 0;
  return p;
}

kernels::AdamWParams adamw_params(const AdamWOptions& options, std::int64_t steps, double lr) {
  kernels::AdamWParams p{};
  p.lr = lr;
  p.beta1 = options.beta1;
  p.beta2 = options.beta2;
  p.eps = options.eps;
  p.weight_decay = options.weight_decay;
  p.step = steps + 1;
  return p;
}

}  // namespace

std::size_t Sgd::scalars_bytes() const { return sizeof(kernels::SgdScalars); }

void Sgd::scalars_of_step(std::int64_t steps, double lr, void* out) const {
  const kernels::SgdScalars s = kernels::sgd_scalars(sgd_params(options_, steps, lr));
  std::memcpy(out, &s, sizeof s);
}

void Sgd::write_scalars(std::int64_t steps, double lr, void* device_scalars, const Stream& stream) const {
  static_assert(sizeof(kernels::SgdScalars) <= kDeviceScalarBytes, "the step's scalars must fit the device slot");
  auto* slot = static_cast<kernels::SgdScalars*>(device_scalars);
  kernels::SgdParams p = sgd_params(options_, steps, lr);
  p.device_scalars = slot;
  DDP_DISPATCH(store_.device(), write_sgd_scalars, p, slot, stream.handle());
}

void Sgd::update(std::int64_t steps, double lr, const void* device_scalars, const Stream& stream) {
  kernels::SgdParams prepared = sgd_params(options_, steps, lr);
  prepared.device_scalars = static_cast<const kernels::SgdScalars*>(device_scalars);
  float* params = store_.flat_params().data<float>();
  float* grads = store_.flat_grads().data<float>();
  float* momentum = momentum_.defined() ? momentum_.data<float>() : nullptr;
  auto* copy = static_cast<std::uint16_t*>(bf16_copy_data());
  update_spans(stream, [&](const FlatSpan& s, std::int64_t state_offset) {
    DDP_DISPATCH(store_.device(), sgd_step, params + s.offset, grads + s.offset,
                 momentum != nullptr ? momentum + state_offset : nullptr, s.count, prepared,
                 copy != nullptr ? copy + s.offset : nullptr, stream.handle());
  });
}

std::vector<std::pair<std::string, Tensor>> Sgd::state() const {
  if (!momentum_.defined()) return {};
  return {{"momentum_buffer", momentum_}};
}

AdamW::AdamW(ParameterStore& store, const AdamWOptions& options, const Stream& stream)
    : Optimizer(store), options_(options) {
  DDP_CHECK(options.lr >= 0.0f, "AdamW: the learning rate (lr) must be >= 0, got " + std::to_string(options.lr));
  DDP_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f && options.beta2 >= 0.0f && options.beta2 < 1.0f,
            "AdamW: betas must be in [0, 1), got (" + std::to_string(options.beta1) + ", " +
                std::to_string(options.beta2) + ")");
  DDP_CHECK(options.eps >= 0.0f, "AdamW: eps must be >= 0");
  lr_ = options.lr;
  adopt_store_layout(stream);
}

void AdamW::make_state(const Stream& stream) {
  exp_avg_ = Tensor::zeros({state_numel()}, DType::kFloat32, store_.device(), stream);
  exp_avg_sq_ = Tensor::zeros({state_numel()}, DType::kFloat32, store_.device(), stream);
}

std::size_t AdamW::scalars_bytes() const { return sizeof(kernels::AdamWScalars); }

void AdamW::scalars_of_step(std::int64_t steps, double lr, void* out) const {
  const kernels::AdamWScalars s = kernels::adamw_scalars(adamw_params(options_, steps, lr));
  std::memcpy(out, &s, sizeof s);
}

void AdamW::write_scalars(std::int64_t steps, double lr, void* device_scalars, const Stream& stream) const {
  static_assert(sizeof(kernels::AdamWScalars) <= kDeviceScalarBytes, "the step's scalars must fit the device slot");
  auto* slot = static_cast<kernels::AdamWScalars*>(device_scalars);
  kernels::AdamWParams p = adamw_params(options_, steps, lr);
  p.device_scalars = slot;
  DDP_DISPATCH(store_.device(), write_adamw_scalars, p, slot, stream.handle());
}

void AdamW::update(std::int64_t steps, double lr, const void* device_scalars, const Stream& stream) {
  kernels::AdamWParams prepared = adamw_params(options_, steps, lr);
  prepared.device_scalars = static_cast<const kernels::AdamWScalars*>(device_scalars);
  float* params = store_.flat_params().data<float>();
  float* grads = store_.flat_grads().data<float>();
  float* m = exp_avg_.data<float>();
  float* v = exp_avg_sq_.data<float>();
  auto* copy = static_cast<std::uint16_t*>(bf16_copy_data());
  update_spans(stream, [&](const FlatSpan& s, std::int64_t state_offset) {
    DDP_DISPATCH(store_.device(), adamw_step, params + s.offset, grads + s.offset, m + state_offset,
                 v + state_offset, s.count, prepared, copy != nullptr ? copy + s.offset : nullptr, stream.handle());
  });
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

CosineWithWarmup::CosineWithWarmup(double base_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                                   double min_lr)
    : base_(base_lr), min_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  DDP_CHECK(warmup_steps >= 0 && total_steps >= warmup_steps,
            "CosineWithWarmup: need 0 <= warmup_steps <= total_steps, got warmup " + std::to_string(warmup_steps) +
                ", total " + std::to_string(total_steps));
}

double CosineWithWarmup::lr_at(std::int64_t step) const {
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_ || total_ == warmup_) return min_;
  const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  constexpr double kPi = 3.14159265358979323846;
  return min_ + 0.5 * (base_ - min_) * (1.0 + std::cos(kPi * progress));
}

}  // namespace ddp
