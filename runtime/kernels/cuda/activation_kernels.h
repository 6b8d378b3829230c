// The activation and bias kernels that runtime/kernels/cuda/linear.cu composes around its GEMMs, where a cuBLASLt epilogue
// cannot do the job (exact-erf GELU, gradients from y or pre_activation, bias gradients that accumulate).
// Host-callable launchers; every one enqueues on `stream` and checks its launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "runtime/kernels/cuda/partial_products.h"
#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda::detail {

// Over a row-major [rows, cols] matrix of `dtype` (float32 or bfloat16), with z = z_in + bias (bias per column,
// may be null): pre_out = z when pre_out is non-null, then y = act(z). z_in may alias pre_out or y.
void bias_activation(DType dtype, Activation act, const void* z_in, const void* bias, void* pre_out, void* y,
                     std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// bias_activation (float32) with z_in the sum of partial products, added in part order as they are read: a GEMM's
// result taken without cuBLASLt's split-K reduction kernel. Takes rows of a multiple of 8 elements and 16-byte
// aligned bias, pre_out and y (bias_activation_takes_parts).
bool bias_activation_takes_parts(const void* bias, const void* pre_out, const void* y, std::int64_t cols);
void bias_activation_from_parts(const PartialProducts& z, const float* bias, Activation act, float* pre_out, float* y,
                                std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// dz = dy ⊙ act'(saved) (saved is y for kRelu, pre_activation for kGelu; for kNone dz = dy, written only when dz
// is non-null, which is how a float32 dy becomes a bfloat16 dz) and, when dbias is non-null, dbias (+)= Σ_rows dz,
// in float with a fixed summation order, of dz as stored. dy and saved are `dy_type`, dz is `dz_type`, dbias is
// `bias_type` (each float32 or bfloat16). dz may alias dy when the two types are the same.
void activation_grad_bias(DType dy_type, DType dz_type, DType bias_type, Activation act,
                          const void* dy, const void* saved, void* dz, void* dbias, bool accumulate,
                          std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// activation_grad_bias (float32 throughout) with dy the sum of partial products, added in part order as they are
// read: a GEMM's result taken without cuBLASLt's split-K reduction kernel. dz is always written. Takes rows of a
// multiple of 8 elements and 16-byte aligned saved and dz (activation_grad_bias_takes_parts).
bool activation_grad_bias_takes_parts(Activation act, const void* saved, const void* dz, std::int64_t cols);
void activation_grad_bias_from_parts(const PartialProducts& dy, Activation act, const float* saved, float* dz,
                                     float* dbias, bool accumulate, std::int64_t rows, std::int64_t cols,
                                     cudaStream_t stream);

}  // namespace ddp::kernels::cuda::detail
