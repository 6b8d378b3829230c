// The activation and bias kernels that runtime/kernels/cuda/linear.cu composes around its GEMMs, where a cuBLASLt epilogue
// cannot do the job (exact-erf GELU, gradients from y or pre_activation, bias gradients that accumulate).
// Host-callable launchers; every one enqueues on `stream` and checks its launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda::detail {

// Over a row-major [rows, cols] matrix of `dtype` (float32 or bfloat16), with z = z_in + bias (bias per column,
// may be null): pre_out = z when pre_out is non-null, then y = act(z). z_in may alias pre_out or y.
void bias_activation(DType dtype, Activation act, const void* z_in, const void* bias, void* pre_out, void* y,
                     std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// dz = dy ⊙ act'(saved) (saved is y for kRelu, pre_activation for kGelu; for kNone dz = dy, written only when dz
// is non-null, which is how a float32 dy becomes a bfloat16 dz) and, when dbias is non-null, dbias (+)= Σ_rows dz,
// in float with a fixed summation order, of dz as stored. dy and saved are `dy_type`, dz is `dz_type`, dbias is
// `bias_type` (each float32 or bfloat16). dz may alias dy when the two types are the same.
void activation_grad_bias(DType dy_type, DType dz_type, DType bias_type, Activation act,
                          const void* dy, const void* saved, void* dz, void* dbias, bool accumulate,
                          std::int64_t rows, std::int64_t cols, cudaStream_t stream);

}  // namespace ddp::kernels::cuda::detail
