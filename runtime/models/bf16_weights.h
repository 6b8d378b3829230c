// Mixed-precision training with bfloat16 weight copies and FP32 master weights, as
// PyTorch's autocast does it: the ParameterStore keeps the FP32 parameters the optimizer updates; this class
// keeps ONE flat bfloat16 copy in the same layout, and the forward runs its GEMMs on the bf16 copies (FP32
// accumulation inside cuBLASLt / the CPU kernels).
//
// Where it goes further than autocast, each saving a pass over memory per step:
//   * the copy is refreshed by the optimizer's own kernel (Optimizer::set_bf16_copy), not by a cast pass;
//   * forward_bf16's GEMMs write the weight and bias gradients in FP32 straight into the masters' gradient
//     slots (ops::linear_mixed): no bf16 weight gradient, no cast back, and the DDP hooks fire on the masters;
//   * the logits stay bfloat16 into the loss, whose gradient is bfloat16 too (as under autocast), or the last
//     GEMM writes them in FP32 directly (forward_bf16's logits_dtype): no cast pass either way.
//
//   Bf16Weights w(*model.parameter_store(), stream);        // after flatten / DDP relayout
//   optimizer.set_bf16_copy(w.flat());                      // or call w.refresh(stream) after each step
//   loss = cross_entropy(forward_bf16(model, w, x, stream), y, stream);
//   ddp.backward(loss); optimizer.step(stream);
//
// weight(i) is the general-purpose alternative for models of one's own: a differentiable bf16 copy whose
// gradient is cast into the master's FP32 gradient slot (one cast pass per weight, as autocast).
#pragma once

#include <cstddef>

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/stream.h"
#include "runtime/models/layers.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class Bf16Weights {
 public:
  // Allocates the bf16 copy in `store`'s current layout and fills it. Made for that layout: after a relayout
  // (DistributedDataParallel's, a move) every use throws InvalidArgument saying to make it afterwards.
  Bf16Weights(const ParameterStore& store, const Stream& stream = current_stream());
  // Casts the FP32 parameters into the bf16 copy: one kernel over the flat buffer.
  void refresh(const Stream& stream = current_stream());
  // The bf16 copy of parameter `index` (registration order), differentiable: its gradient is cast to float32
  // and written (or accumulated) into the parameter's FP32 gradient. Call it in every forward.
  Tensor weight(std::size_t index) const;
  // The bf16 copy of parameter `index`, not differentiable (for ops::linear_mixed, which routes the gradient to
  // the master itself).
  Tensor copy(std::size_t index) const;
  // Registration index of `param` (a tensor of the store), or throws.
  std::size_t index_of(const Tensor& param) const;
  const Tensor& flat() const { return flat_; }

 private:
  void check_layout() const;

  const ParameterStore& store_;
  std::int64_t layout_version_;  // the store's layout the copy is in
  Tensor flat_;  // bfloat16 [total_numel]
};

// Differentiable float32 <-> bfloat16 cast (a new tensor; the backward casts the gradient back).
Tensor cast(const Tensor& x, DType dtype, const Stream& stream = current_stream());

// The forward of `model` (Linear layers with fused activations, as Sequential::forward) on the bf16 copies:
// `x` float32 is cast to bf16, every GEMM runs in bf16 through ops::linear_mixed (FP32 gradients into the
// masters). The last GEMM writes the logits in `logits_dtype`: bfloat16 (as autocast; ops::cross_entropy takes
// them, in half the memory and traffic of float32 logits and their gradient) or float32.
Tensor forward_bf16(const Sequential& model, const Bf16Weights& weights, const Tensor& x, const Stream& stream,
                    DType logits_dtype = DType::kBFloat16);

}  // namespace ddp
