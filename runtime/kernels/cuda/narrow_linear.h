// Linear layers with few outputs (a classifier's head: 10 classes from 512 features), forward and backward each
// in one kernel of our own instead of cuBLASLt's GEMMs. Host-callable launchers used by linear.cu.
//
// Why: with out ≤ 32 the GEMMs have too few output tiles to fill the GPU, so cuBLASLt splits K and adds the
// parts in a second kernel; the head's backward was five kernels (dw, its reduction, the bias gradient, dx, its
// reduction) of a few microseconds each where the arithmetic is a few thousand products per row. Here the
// forward is one warp per row (the row's dot products with every output, the weights staged in shared memory,
// reduced by shuffles), and the backward is one block per 32 input columns that produces that slice of dx and dw
// and, in the first block, the bias gradient: one launch, sums in a fixed order, no atomics.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda::detail {

// The widest layer these kernels take.
inline constexpr std::int64_t kNarrowMaxOut = 32;

// Whether linear_forward may use narrow_linear_forward for this shape.
bool narrow_forward_fits(const LinearShape& shape);
// Whether linear_backward may use narrow_linear_backward: each block walks every row, so the batch is bounded.
bool narrow_backward_fits(const LinearShape& shape);

// y = act(x·wᵀ + bias) as linear_forward's contract (types, bias may be null, pre_activation written for kGelu
// when non-null), products and sums in float.
void narrow_linear_forward(LinearTypes types, const LinearShape& shape, const void* x, const void* w,
                           const void* bias, Activation act, void* y, void* pre_activation, cudaStream_t stream);

// linear_backward's contract in one launch: dz = dy ⊙ act'(saved) in float (saved is y for kRelu,
// pre_activation for kGelu), dx = dz·w (when non-null), dw (+)= dzᵀ·x (when non-null), dbias (+)= Σ_rows dz (when
// non-null), and, when scratch_dz is non-null, dz stored there in the input type.
void narrow_linear_backward(LinearTypes types, const LinearShape& shape, const void* dy, const void* saved,
                            Activation act, const void* x, const void* w, void* dx, void* dw, void* dbias,
                            bool accumulate, void* scratch_dz, cudaStream_t stream);

}  // namespace ddp::kernels::cuda::detail
