// Tensor-level ops with autograd, part 2: standalone elementwise activations (float32). Inside an MLP the
// activation is normally fused into the preceding linear (runtime/ops/linear.h); these serve everything else.
#pragma once

#include "runtime/core/activation.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {

Tensor activation(const Tensor& x, Activation act, const Stream& stream = current_stream());
inline Tensor relu(const Tensor& x, const Stream& stream = current_stream()) {
  return activation(x, Activation::kRelu, stream);
}
// Exact (erf) GELU, as torch.nn.GELU().
inline Tensor gelu(const Tensor& x, const Stream& stream = current_stream()) {
  return activation(x, Activation::kGelu, stream);
}
// x·sigmoid(x), as torch.nn.SiLU() (standalone only: never fused into a linear).
inline Tensor silu(const Tensor& x, const Stream& stream = current_stream()) {
  return activation(x, Activation::kSilu, stream);
}

}  // namespace ddp::ops
