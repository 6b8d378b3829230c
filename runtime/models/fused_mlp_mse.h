// A plain MLP's forward, mean-squared-error loss and backward as one pass (the kernels' fused_mlp_mse), instead of
// layer by layer through autograd: the fast path of a narrow network (an in-situ surrogate, 64 wide) whose step
// is otherwise a dozen and more launches of a few microseconds each. It lives apart from the autograd path and
// takes only what it computes exactly as that path does: a float32 MLP of Linear layers at most
// kernels::kFusedMlpMaxWidth wide with ReLU, tanh or no activation between them. The sums run in another order
// than the GEMMs', so its results agree with the autograd path's to float rounding, not bit for bit; they are
// the same bits from run to run, eager or replayed in a CUDA graph.
//
//   ddp::FusedMlpMse fused(model);                 // after the model's parameters are flat (an optimizer made)
//   ddp::Tensor loss = fused(x, y, stream);         // the gradients written, as autograd's backward would
#pragma once

#include <string>

#include "runtime/core/stream.h"
#include "runtime/models/layers.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class FusedMlpMse {
 public:
  // Why `model` cannot take the fused pass on `device` (its activation, a layer too wide, too deep for shared
  // memory, weights not float32, no gradients yet), or "" when it can.
  static std::string unfit_reason(const MLP& model);

  // `model` must outlive this and fit (InvalidArgument with unfit_reason otherwise).
  explicit FusedMlpMse(MLP& model);

  // The model's output for x [rows, in], the mean squared error against y [rows, out] (float32, on the model's
  // device) and every parameter's gradient, written (not added to) on `stream`. Returns the loss, one float32 on
  // the device: the same tensor at every call, so a CUDA graph that captured the call reads it after each replay.
  Tensor operator()(const Tensor& x, const Tensor& y, const Stream& stream);

 private:
  MLP& model_;
  Tensor loss_;       // [1]
  Tensor partials_;   // the CUDA pass's per-block partial sums, grown to the largest batch seen
};

}  // namespace ddp
