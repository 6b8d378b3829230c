// Tensor-level ops with autograd, part 4: elementwise arithmetic on float32 tensors and the differentiable copy
// to another device. With these (and Tensor's own fill_, copy_from, scale_ and add_) a program never needs the
// kernel layer: residual connections, masks, scaled losses and the like are a few calls.
//
// Every op returns a new tensor on its inputs' device, enqueued on `stream` (a stream of that device when it is
// a GPU; on the CPU the work is done when the call returns), and records its backward when grad mode is on and
// an input requires grad. Inputs must be defined, float32, of one shape and on one device; anything else is an
// InvalidArgument naming the op and the tensors.
#pragma once

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {

// a + b. Gradient: dy to each input.
Tensor add(const Tensor& a, const Tensor& b, const Stream& stream = current_stream());
// alpha · x. Gradient: alpha · dy.
Tensor scale(const Tensor& x, double alpha, const Stream& stream = current_stream());
// a ⊙ b, elementwise. Gradients: dy ⊙ b and dy ⊙ a.
Tensor mul(const Tensor& a, const Tensor& b, const Stream& stream = current_stream());

// A copy of `x` (any compute dtype) on `device`: host to device, device to host (into pinned memory, valid once
// `stream` has synchronised) or between devices, on `stream`, which must be a CUDA stream whenever either side
// is a GPU (of the GPU side, or of the destination between two GPUs). Differentiable for float32: the gradient
// is copied back to x's device, which needs backward to run on such a CUDA stream too (InvalidArgument
// otherwise).
Tensor to_device(const Tensor& x, const Device& device, const Stream& stream = current_stream());

}  // namespace ddp::ops
