// How the GPU Linear chooses and schedules its cuBLASLt GEMMs. Process-wide settings, read from the
// environment on first use and settable from code.
//
// Why these are switches and not fixed choices:
//   * autotune: cuBLASLt's first heuristic is deterministic but not always the fastest kernel, most of all for
//     small batches where few output tiles cannot fill 132 SMs and split-K or smaller tiles win. Timing the top
//     candidates (the idea of torch.backends.cudnn.benchmark) finds the fastest, but which one wins can change
//     from run to run with noise, and different algorithms round differently: results stay correct but are no
//     longer bitwise repeatable across runs. So it is opt-in.
//   * concurrent backward: a Linear's dx and dw GEMMs are independent, and on two streams they could fill the
//     GPU together where either alone leaves SMs idle. Measured, they do not: the GEMMs alone gain little,
//     and a CUDA graph of the small main-job step is slower with the branches than serial (the split-K
//     kernels of both GEMMs then compete for the SMs; bench/RESULTS.md). So it is off by default; the
//     arithmetic is the same either way (each GEMM is the same call), kept for models where it wins.
//   * narrow layers: a Linear of at most 32 outputs (a classifier's head) runs on our own one-launch kernels
//     (narrow_linear.h) instead of cuBLASLt's split-K GEMMs and their reductions. On by default; the switch is
//     for measuring one against the other.
#pragma once

namespace ddp::kernels::cuda {

struct GemmOptions {
  // DDP_GEMM_AUTOTUNE=1: on the first call of each GEMM configuration outside CUDA-graph capture, time up to
  // 16 of cuBLASLt's candidates on scratch outputs and keep the fastest (costs milliseconds per shape once).
  bool autotune = false;
  // DDP_GEMM_CONCURRENT_BACKWARD=1 turns it on: dw on a second stream, forked from and joined back into the
  // caller's stream with events (also inside CUDA-graph capture).
  bool concurrent_backward = false;
  // DDP_GEMM_BIAS_EPILOGUE=0 turns it off: the forward GEMM without cuBLASLt's BIAS / RELU_BIAS epilogue, and
  // our vectorised bias+activation pass after it (for GEMM kernels that run their epilogue as a slow pass of
  // its own; see bench/RESULTS.md).
  bool bias_epilogue = true;
  // DDP_GEMM_NARROW=0 turns it off: layers of at most 32 outputs through cuBLASLt like every other.
  bool narrow_layers = true;
  // DDP_GEMM_LOG=1: one line on stderr per new GEMM configuration: shape, types, epilogue, the algorithm kept
  // and, with autotune, the time of cuBLASLt's first choice against the fastest.
  bool log = false;
};

GemmOptions gemm_options();
// Applies to GEMM configurations seen from now on (plans already built keep their algorithm).
void set_gemm_options(const GemmOptions& options);

}  // namespace ddp::kernels::cuda

namespace ddp {
// The public names (the GPU Linear's settings are part of the public API).
using kernels::cuda::gemm_options;
using kernels::cuda::GemmOptions;
using kernels::cuda::set_gemm_options;
}  // namespace ddp
