// Tensor-level ops with autograd, part 1: the linear layer with its fused activation.
//
// Each op dispatches on the tensors' device to ddp::kernels::cpu or ::cuda (runtime/kernels/dispatch.h), runs on the
// explicit `stream`, and — when grad mode is on and an input requires grad — records its backward on the tape
// (runtime/autograd/autograd.h). Parameter gradients are written in place into their gradient views
// (ParameterStore), accumulating when already valid.
#pragma once

#include "runtime/core/activation.h"
#include "runtime/core/dtype.h"
#include "runtime/core/math_mode.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {


// y[batch, out] = act(x[batch, in] · w[out, in]ᵀ + b[out]); `b` may be undefined. float32 or bfloat16 (all
// three the same). On the GPU the bias and ReLU are fused into the cuBLASLt epilogue; `math` picks FP32 or
// TF32 for float32 GEMMs there (ignored on the CPU).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
              const Stream& stream = current_stream(), MathMode math = MathMode::kFloat32);

// The Linear of mixed-precision training (runtime/models/bf16_weights.h): the GEMMs read bfloat16 `x` and `w_bf16`, the
// bfloat16 copy of the float32 master weight `w`, and accumulate in float32. The weight and bias gradients are
// written in float32 by the GEMM (and the bias reduction) straight into `w`'s and `b`'s gradients: no bfloat16
// weight gradient is materialised and no cast pass follows, and the masters' grad-ready hooks (DDP) fire as
// for linear(). `out_dtype` is y's type: bfloat16, or float32 for the logits of a float32 loss (then the bias
// added is the float32 master `b`, else its copy `b_bf16`). `b`/`b_bf16` may both be undefined.
Tensor linear_mixed(const Tensor& x, const Tensor& w, const Tensor& w_bf16, const Tensor& b, const Tensor& b_bf16,
                    Activation act, DType out_dtype, const Stream& stream);

}  // namespace ddp::ops
