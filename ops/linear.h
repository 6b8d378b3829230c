// Tensor-level ops with autograd, part 1: the linear layer with its fused activation.
//
// Each op dispatches on the tensors' device to ddp::kernels::cpu or ::cuda (ops/dispatch.h), runs on the
// explicit `stream`, and — when grad mode is on and an input requires grad — records its backward on the tape
// (runtime/autograd/autograd.h). Parameter gradients are written in place into their gradient views
// (ParameterStore), accumulating when already valid.
#pragma once

#include "ops/kernels.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {

using kernels::Activation;
using kernels::MathMode;

// y[batch, out] = act(x[batch, in] · w[out, in]ᵀ + b[out]); `b` may be undefined. float32 or bfloat16 (all
// three the same). On the GPU the bias and ReLU are fused into the cuBLASLt epilogue; `math` picks FP32 or
// TF32 for float32 GEMMs there (ignored on the CPU).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, const Stream& stream,
              MathMode math = MathMode::kFloat32);

}  // namespace ddp::ops
