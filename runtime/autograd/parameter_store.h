// ParameterStore: every parameter of a model in ONE flat float32 buffer and every gradient in ONE flat
// gradient buffer on the model's device; each parameter tensor and its .grad() are views into them.
//
// Why: the optimizer then updates all parameters with one fused kernel over the flat buffers, and the DDP
// reducer all-reduces slices of the gradient buffer directly (a bucket is a view: no copy in or out). Backward
// writes each gradient straight into its slot (linear_backward's dw/db land in the view, accumulating when the
// gradient is already valid).
//
// Layout: parameters are identified by their registration index i (Module::named_parameters order). `layout`
// lists registration indices in flat-buffer order; parameter layout[0] starts at offset 0, the next at the
// first multiple of kSlotAlignment after it, and so on (total_numel() includes that padding). Parameters and gradients use the same layout (slot(i).offset is valid in both).
// The DDP reducer passes BucketPlan::layout_order() (reverse registration order, bucket by bucket), so
// slot(i).offset equals BucketPlan::offsets[i] and each bucket is one contiguous slice of flat_grads().
// relayout() changes the order later (values are preserved), optionally with padding after some slots (the
// sharded DDP pads each bucket to a multiple of the world size), and counts a new layout_version(), by which an
// optimizer's state buffers know they are stale. set_optimizer_shard() (see optimizer_shard.h) counts one too.
//
// Grad-ready hooks: add_grad_ready_hook(fn) makes backward call fn(i) on the calling thread as soon as
// parameter i's gradient is final for that backward (see runtime/autograd/autograd.h for the exact rule), once
// per parameter per backward, in the order the gradients become final.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class GradientGate;    // runtime/autograd/gradient_gate.h
class OptimizerShard;  // runtime/autograd/optimizer_shard.h

// `count` elements of a flat buffer from element `offset`.
struct FlatSpan {
  std::int64_t offset = 0;
  std::int64_t count = 0;
  std::int64_t end() const { return offset + count; }
};

// Every slot starts at a multiple of this many elements (64 bytes), so each parameter and gradient view is
// aligned for vector loads and cuBLASLt's fastest kernels and bias epilogues whatever the sizes before it.
// The padding between slots is zero and stays zero (no gradient is ever written there).
constexpr std::int64_t kSlotAlignment = 16;
inline std::int64_t align_slot(std::int64_t offset) {
  return (offset + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
}

struct ParameterSlot {
  std::string name;          // state-dict key, e.g. "2.weight"
  Shape shape;
  std::int64_t numel = 0;
  std::int64_t offset = 0;   // first element in flat_params() and flat_grads()
  Tensor param;              // the model's parameter tensor (every handle of it): a view of flat_params()
  Tensor grad;               // a view of flat_grads(); also param.grad()
};

class ParameterStore {
 public:
  using GradReadyHook = std::function<void(std::size_t parameter_index)>;

  // Moves `parameters` (name, tensor, in registration order; float32, any device) into the flat buffers on
  // `device`: every handle of each tensor is re-pointed at its view, requires_grad is set, gradients start
  // zeroed. `layout`: registration indices in flat order; empty means registration order.
  ParameterStore(std::vector<std::pair<std::string, Tensor>> parameters, const Device& device,
                 const Stream& stream, std::vector<std::size_t> layout = {});
  ~ParameterStore();
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  std::size_t size() const { return slots_.size(); }
  const ParameterSlot& slot(std::size_t index) const;  // by registration index
  const std::vector<ParameterSlot>& slots() const { return slots_; }
  const std::vector<std::size_t>& layout() const { return layout_; }
  // Counts the layouts this store has had: buffers laid out for an older one (an optimizer's state) are stale.
  std::int64_t layout_version() const { return layout_version_; }
  std::int64_t total_numel() const { return total_; }
  const Device& device() const { return device_; }
  const Tensor& flat_params() const { return flat_params_; }  // float32 [total_numel]
  const Tensor& flat_grads() const { return flat_grads_; }    // float32 [total_numel]
  std::vector<Tensor> parameters() const;                     // registration order

  // Re-lays both buffers in `layout` order, preserving parameter values and gradients. Without `offsets` the
  // slots are packed (each at the first aligned offset after the previous one); with them, slot i starts at
  // offsets[i] (registration index; aligned, in `layout` order, not overlapping) and the buffers hold `total`
  // elements, the gaps zero.
  void relayout(std::vector<std::size_t> layout, const Stream& stream, const std::vector<std::int64_t>& offsets = {},
                std::int64_t total = 0);
  // Moves both buffers to `device` in `layout` order, preserving parameter values and zeroing the gradients
  // (`stream` must be able to copy between the two devices). This object stays: whoever holds it sees a new
  // layout_version().
  void move_to(const Device& device, std::vector<std::size_t> layout, const Stream& stream);
  // True when `parameters` are this store's tensors (by identity), in registration order.
  bool holds(const std::vector<std::pair<std::string, Tensor>>& parameters) const;
  // Zero-fills the flat gradient buffer (one kernel) and marks every gradient "to be overwritten".
  void zero_grad(const Stream& stream = current_stream());

  void add_grad_ready_hook(GradReadyHook hook);
  void clear_grad_ready_hooks();

  // The part of the update this process owns (null: all of it). Setting it counts a new layout_version(): an
  // optimizer made before re-makes its state for the shard at its first step.
  void set_optimizer_shard(std::shared_ptr<OptimizerShard> shard);
  OptimizerShard* optimizer_shard() const { return optimizer_shard_.get(); }
  // The same, shared: an optimizer keeps it for as long as its state is made for it.
  const std::shared_ptr<OptimizerShard>& shared_optimizer_shard() const { return optimizer_shard_; }

  // Gradients that become final piece by piece (see gradient_gate.h), or null: final when backward returns.
  // The gate's owner sets it and clears it (null) before it goes away.
  void set_gradient_gate(GradientGate* gate) { gradient_gate_ = gate; }
  GradientGate* gradient_gate() const { return gradient_gate_; }
  // Orders `stream` after every gradient is final: for code that reads the gradients other than through an
  // optimizer's update (which waits piece by piece). Nothing without a gate.
  void wait_for_gradients(const Stream& stream) const;

 private:
  struct HookList {
    std::vector<GradReadyHook> hooks;
  };
  void build(const std::vector<std::size_t>& layout, const std::vector<std::int64_t>& offsets, std::int64_t total,
             const Stream& stream, bool copy_grads);

  Device device_;
  std::vector<ParameterSlot> slots_;
  std::vector<std::size_t> layout_;
  std::int64_t total_ = 0;
  std::int64_t layout_version_ = 0;
  Tensor flat_params_;
  Tensor flat_grads_;
  std::shared_ptr<HookList> hooks_;  // shared with the per-tensor hooks, emptied when the store goes away
  std::shared_ptr<OptimizerShard> optimizer_shard_;
  GradientGate* gradient_gate_ = nullptr;
};

}  // namespace ddp
