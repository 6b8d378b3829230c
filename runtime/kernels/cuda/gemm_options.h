// How the GPU Linear chooses and schedules its cuBLASLt GEMMs. Process-wide settings, read from the
// environment on first use and settable from code.
//
// Why these are switches and not fixed choices:
//   * autotune: cuBLASLt's first heuristic is deterministic but not always the fastest kernel, most of all for
//     small batches where few output tiles cannot fill 132 SMs and split-K or smaller tiles win. Timing the top
//     candidates (the idea of torch.backends.cudnn.benchmark) finds the fastest, but which one wins can change
//     from run to run with noise, and different algorithms round differently: results stay correct but are no
//     longer bitwise repeatable across runs. So it is opt-in.
//   * concurrent backward: a Linear's dx and dw GEMMs are independent, and on two streams they fill the GPU
//     together where either alone leaves SMs idle. On by default: with partial products (below) every step
//     measured is faster with the branches. Without them it is not: cuBLASLt's split-K kernels of both GEMMs
//     then compete for the SMs and the main job's small step is slower than serial (bench/RESULTS.md), so
//     DDP_GEMM_PARTS=0 wants DDP_GEMM_CONCURRENT_BACKWARD=0 beside it. The arithmetic is the same either way
//     (each GEMM is the same call).
//   * narrow layers: a Linear of at most 32 outputs (a classifier's head) runs on our own one-launch kernels
//     (narrow_linear.h) instead of cuBLASLt's split-K GEMMs and their reductions. On by default; the switch is
//     for measuring one against the other.
//   * partial products: a wide layer followed by a narrow one (an MLP's last hidden layer and its head, as
//     kernels::linear_pair_forward runs them) leaves cuBLASLt too few output tiles to fill the GPU, so it splits
//     K and adds the parts in a reduction kernel of its own. With `parts`, the hidden layer's slices of K run as
//     one batched GEMM that never splits K again, and the head's narrow kernel adds the slices (with the bias
//     and the activation) as it reads its input: the reduction kernel goes. A backward's input gradient taken
//     through the activation below it (linear_backward's `through`) does the same: its slices' parts are added
//     by that activation's gradient pass. On by default (the rule): measured on the GPU against cuBLASLt's own
//     split with bench/step_ab.sh (bench/RESULTS.md); the sums run in slice order, so results stay bitwise
//     repeatable.
#pragma once

#include <cstdint>

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda {

struct GemmOptions {
  // DDP_GEMM_AUTOTUNE=1: on the first call of each GEMM configuration outside CUDA-graph capture, time up to
  // 16 of cuBLASLt's candidates on scratch outputs and keep the fastest (costs milliseconds per shape once).
  bool autotune = false;
  // DDP_GEMM_CONCURRENT_BACKWARD=0 turns it off: dw on a second stream, forked from and joined back into the
  // caller's stream with events (also inside CUDA-graph capture).
  bool concurrent_backward = true;
  // DDP_GEMM_BIAS_EPILOGUE=0 turns it off: the forward GEMM without cuBLASLt's BIAS / RELU_BIAS epilogue, and
  // our vectorised bias+activation pass after it (for GEMM kernels that run their epilogue as a slow pass of
  // its own; see bench/RESULTS.md).
  bool bias_epilogue = true;
  // DDP_GEMM_NARROW=0 turns it off: layers of at most 32 outputs through cuBLASLt like every other.
  bool narrow_layers = true;
  // DDP_GEMM_LOG=1: one line on stderr per new GEMM configuration: shape, types, epilogue, the algorithm kept
  // and, with autotune, the time of cuBLASLt's first choice against the fastest.
  bool log = false;
  // DDP_GEMM_PARTS: how many slices of K the pair forward's hidden layer (and an input gradient taken through
  // an activation) is computed in. -1 (the default): a rule from the shape (partial_product_count in linear.cu);
  // 0: none, cuBLASLt's own GEMM; n in [2, 8]: n slices where the shape allows it (K a multiple of n, slices
  // 16-byte aligned).
  int parts = -1;
  // DDP_GEMM_PLAIN_PARTS=0 turns it off. With `parts`, also a wide float32 layer whose result none of our
  // kernels reads (an MLP's first hidden layer) as partial products, added with the bias and the activation by
  // our pass in place of cuBLASLt's reduction kernel (and its fused epilogue). A separate switch: there a kernel
  // of ours replaces cuBLASLt's rather than one launch going, so whether it wins is a separate measurement.
  bool plain_layer_parts = true;
};

GemmOptions gemm_options();
// Applies to GEMM configurations seen from now on (plans already built keep their algorithm).
void set_gemm_options(const GemmOptions& options);

// The number of partial products kernels::linear_pair_forward computes the first layer in, for a pair of layers
// `first` (batch, in, hidden) and hidden -> `out`, under the current options: 1 when the pair runs as two plain
// Linears. Float32 only.
int linear_pair_parts(DType dtype, const LinearShape& first, std::int64_t out);
// The number of partial products kernels::linear_forward computes a Linear in under the current options (with
// plain_layer_parts): 1 for one GEMM. Float32 only.
int linear_forward_parts(LinearTypes types, const LinearShape& shape);
// The number of partial products kernels::linear_backward computes a Linear's dx in when it is taken through the
// input's activation (`through`) under the current options: 1 for one GEMM. Float32 only.
int input_gradient_parts(LinearTypes types, const LinearShape& shape);

}  // namespace ddp::kernels::cuda

namespace ddp {
// The public names (the GPU Linear's settings are part of the public API).
using kernels::cuda::gemm_options;
using kernels::cuda::GemmOptions;
using kernels::cuda::set_gemm_options;
}  // namespace ddp
