// Tensor-level ops with autograd, part 5: what the MLP-family layers of runtime/models/layers.h are made of
// (LayerNorm, a frequency encoding, dropout, embeddings and the column slicing and concatenation that
// categorical features need). float32 only: bf16 variants of these ops are not written yet (TF32 concerns the
// GEMMs of Linear only). Each op dispatches to kernels::cpu or ::cuda, runs on `stream`, and on a GPU neither
// reads the host nor allocates anything whose size depends on the data, so a step made of them can be captured
// as a CUDA graph.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {

// torch.nn.functional.layer_norm over the last dimension of x [..., cols]: y = (x − mean)/√(var + eps)·weight +
// bias with the biased variance; weight and bias are [cols] or both undefined. The backward gives x, weight and
// bias their gradients from the mean and 1/√(var + eps) the forward kept.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  const Stream& stream = current_stream());

// The NeRF frequency encoding of x [rows, in]: [x (if include_input), sin(2^0·π·x), cos(2^0·π·x), ...,
// sin(2^(L−1)·π·x), cos(2^(L−1)·π·x)] along columns, each block `in` wide, so the output is
// [rows, in·(include_input + 2·L)]. The argument is float(2^k·π)·x rounded to float, as the same expression in
// PyTorch computes it. Parameter-free; the gradient flows into x.
Tensor frequency_encoding(const Tensor& x, std::int64_t frequencies, bool include_input = true,
                          const Stream& stream = current_stream());

// Inverted dropout as torch.nn.functional.dropout in training: each element kept with probability 1 − p and
// scaled by 1/(1 − p), the mask a function of (seed, *draw, element) (runtime/kernels/counter_rng.h), where
// `draw` is an int64 tensor of one element on x's device. The mask is drawn from the value the counter holds
// when the kernel runs, and a second kernel then adds 1 to it: called once per step, eagerly or replayed from a
// CUDA graph, every step draws a new mask and the host does nothing. p in [0, 1); p == 0 returns x unchanged
// and leaves the counter alone.
Tensor dropout(const Tensor& x, double p, std::uint64_t seed, const Tensor& draw,
               const Stream& stream = current_stream());

// torch.nn.functional.embedding: rows `indices` (int32 [n]) of `weight` [num, dim] as [n, dim]. The backward
// adds each dy row into the weight gradient's row of its index, rows in index order on both devices (the same
// bits every run). An index outside [0, num) is an InvalidArgument naming it when the indices are on the CPU;
// on a GPU (where checking would read the host, which a captured graph cannot) it gives a row of zeros and no
// gradient, never a read out of bounds.
Tensor embedding(const Tensor& weight, const Tensor& indices, const Stream& stream = current_stream());

// Column `column` of x [rows, cols] as int32 category ids [rows] (not differentiable): a value that is an exact
// integer in [0, cardinality) is its id. Anything else (a fraction, a negative or too large value, a NaN) is an
// InvalidArgument naming the row, column and value on the CPU; on a GPU it becomes −1, which embedding() maps
// to a row of zeros.
Tensor category_ids(const Tensor& x, std::int64_t column, std::int64_t cardinality,
                    const Stream& stream = current_stream());

// Columns [begin, end) of x [rows, cols] (a copy); the gradient goes back into those columns of x.
Tensor slice_columns(const Tensor& x, std::int64_t begin, std::int64_t end, const Stream& stream = current_stream());
// The matrices [rows, c_i] side by side: [rows, Σ c_i] (torch.cat(parts, dim=1)); each part gets its columns of
// the gradient.
Tensor concat_columns(const std::vector<Tensor>& parts, const Stream& stream = current_stream());

}  // namespace ddp::ops
