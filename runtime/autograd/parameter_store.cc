// ParameterStore: building the flat buffers, re-pointing parameter tensors into them, re-laying them out.
#include "runtime/autograd/parameter_store.h"

#include <algorithm>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/gradient_gate.h"
#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/check.h"

namespace ddp {
namespace {

std::vector<std::size_t> checked_layout(std::vector<std::size_t> layout, std::size_t n) {
  if (layout.empty()) {
    layout.resize(n);
    for (std::size_t i = 0; i < n; ++i) layout[i] = i;
    return layout;
  }
  DDP_CHECK(layout.size() == n, "ParameterStore: layout lists " + std::to_string(layout.size()) +
                                    " parameters, the model has " + std::to_string(n));
  std::vector<bool> seen(n, false);
  for (std::size_t i : layout) {
    DDP_CHECK(i < n && !seen[i], "ParameterStore: layout must be a permutation of 0.." + std::to_string(n - 1) +
                                     " (bad or repeated index " + std::to_string(i) + ")");
    seen[i] = true;
  }
  return layout;
}

}  // namespace

ParameterStore::ParameterStore(std::vector<std::pair<std::string, Tensor>> parameters, const Device& device,
                               const Stream& stream, std::vector<std::size_t> layout)
    : device_(device), hooks_(std::make_shared<HookList>()) {
  slots_.reserve(parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    auto& [name, tensor] = parameters[i];
    DDP_CHECK(tensor.defined(), "ParameterStore: parameter " + name + " is undefined");
    DDP_CHECK(tensor.dtype() == DType::kFloat32, "ParameterStore: parameter " + name + " is " +
                                                     tensor.describe() + "; the flat buffers are float32");
    for (std::size_t j = 0; j < i; ++j)
      DDP_CHECK(!slots_[j].param.same(tensor), "ParameterStore: " + name + " and " + slots_[j].name +
                                                   " are the same tensor (shared parameters are not supported)");
    ParameterSlot slot;
    slot.name = name;
    slot.shape = tensor.shape();
    slot.numel = tensor.numel();
    slot.param = tensor;
    slots_.push_back(std::move(slot));
    // Registration index for the hook; the closure holds the list weakly-by-emptying (see ~ParameterStore).
    AutogradMeta& meta = tensor.autograd_meta();
    meta.parameter_index = static_cast<std::int64_t>(i);
    std::shared_ptr<HookList> hooks = hooks_;
    tensor.register_grad_ready_hook([hooks, i] {
      for (const GradReadyHook& h : hooks->hooks) h(i);
    });
  }
  build(checked_layout(std::move(layout), slots_.size()), {}, 0, stream, /*copy_grads=*/false);
  zero_grad(stream);
}

ParameterStore::~ParameterStore() { hooks_->hooks.clear(); }

const ParameterSlot& ParameterStore::slot(std::size_t index) const {
  DDP_CHECK(index < slots_.size(), "ParameterStore: parameter index " + std::to_string(index) + " of " +
                                       std::to_string(slots_.size()));
  return slots_[index];
}

std::vector<Tensor> ParameterStore::parameters() const {
  std::vector<Tensor> out;
  out.reserve(slots_.size());
  for (const ParameterSlot& s : slots_) out.push_back(s.param);
  return out;
}

void ParameterStore::build(const std::vector<std::size_t>& layout, const std::vector<std::int64_t>& offsets,
                           std::int64_t total, const Stream& stream, bool copy_grads) {
  std::vector<std::int64_t> at(slots_.size(), 0);
  if (offsets.empty()) {
    total = 0;
    for (std::size_t i : layout) {
      at[i] = total;
      total = align_slot(total + slots_[i].numel);
    }
  } else {
    DDP_CHECK(offsets.size() == slots_.size(), "ParameterStore: " + std::to_string(offsets.size()) +
                                                   " offsets for " + std::to_string(slots_.size()) + " parameters");
    std::int64_t end = 0;
    for (std::size_t i : layout) {
      DDP_CHECK(offsets[i] >= end && offsets[i] % kSlotAlignment == 0,
                "ParameterStore: parameter " + slots_[i].name + " at offset " + std::to_string(offsets[i]) +
                    " overlaps the one before it (which ends at " + std::to_string(end) + ") or is not aligned");
      end = offsets[i] + slots_[i].numel;
    }
    DDP_CHECK(total >= end, "ParameterStore: a total of " + std::to_string(total) + " elements is less than the " +
                                std::to_string(end) + " the offsets need");
    at = offsets;
  }
  // Zeroed, so the padding between slots is zero in both buffers.
  Tensor params = Tensor::zeros({total}, DType::kFloat32, device_, stream);
  Tensor grads = Tensor::zeros({total}, DType::kFloat32, device_, stream);
  for (std::size_t i : layout) {
    ParameterSlot& s = slots_[i];
    const std::int64_t offset = at[i];
    Tensor pview = params.flat_slice(offset, s.shape);
    Tensor gview = grads.flat_slice(offset, s.shape);
    pview.copy_from(s.param, stream);
    if (copy_grads && s.grad.defined()) gview.copy_from(s.grad, stream);
    const bool valid = copy_grads && s.param.grad_valid();
    s.param.set_data(pview);  // every handle of the module's tensor now points into the flat buffer
    s.param.set_requires_grad(true);
    s.param.set_grad(gview);
    s.param.autograd_meta().grad_valid = valid;
    s.grad = gview;
    s.offset = offset;
  }
  total_ = total;
  layout_ = layout;
  ++layout_version_;
  flat_params_ = params;
  flat_grads_ = grads;
}

void ParameterStore::relayout(std::vector<std::size_t> layout, const Stream& stream,
                              const std::vector<std::int64_t>& offsets, std::int64_t total) {
  build(checked_layout(std::move(layout), slots_.size()), offsets, total, stream, /*copy_grads=*/true);
}

void ParameterStore::set_optimizer_shard(std::shared_ptr<OptimizerShard> shard) {
  optimizer_shard_ = std::move(shard);
  ++layout_version_;
}

void ParameterStore::move_to(const Device& device, std::vector<std::size_t> layout, const Stream& stream) {
  device_ = device;
  build(checked_layout(std::move(layout), slots_.size()), {}, 0, stream, /*copy_grads=*/false);
  zero_grad(stream);
}

bool ParameterStore::holds(const std::vector<std::pair<std::string, Tensor>>& parameters) const {
  if (parameters.size() != slots_.size()) return false;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].param.same(parameters[i].second)) return false;
  }
  return true;
}

void ParameterStore::zero_grad(const Stream& stream) {
  wait_for_gradients(stream);  // a collective still reading a bucket (the optimizer skipped) finishes first
  flat_grads_.zero_(stream);
  for (ParameterSlot& s : slots_) s.param.autograd_meta().grad_valid = false;
}

void ParameterStore::add_grad_ready_hook(GradReadyHook hook) { hooks_->hooks.push_back(std::move(hook)); }

void ParameterStore::clear_grad_ready_hooks() { hooks_->hooks.clear(); }

void ParameterStore::wait_for_gradients(const Stream& stream) const {
  if (gradient_gate_ != nullptr) gradient_gate_->wait_all(stream);
}

}  // namespace ddp
