// How the GPU Linear chooses and schedules its cuBLASLt GEMMs: process-wide settings, settable from code.
// `log` starts from DDP_GEMM_LOG, read on first use; `narrow_layers` is set from code only. Internal to the
// runtime (ddp.h does not include it): benchmarks and tests include it by name.
//
// What the settings are for:
//   * narrow layers: a Linear of at most 32 outputs (a classifier's head) runs on our own one-launch kernels
//     (narrow_linear.h) instead of cuBLASLt's split-K GEMMs and their reductions; the setting sends it through
//     cuBLASLt like every other layer.
#pragma once

#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda {

struct GemmOptions {
  // DDP_GEMM_LOG=1: one line on stderr per new GEMM configuration: shape, types, epilogue and the algorithm's
  // split of K.
  bool log = false;
  // Layers of at most 32 outputs on the narrow kernels.
  bool narrow_layers = true;
};

GemmOptions gemm_options();
// Applies to GEMM configurations seen from now on (plans already built keep their algorithm).
void set_gemm_options(const GemmOptions& options);

}  // namespace ddp::kernels::cuda

namespace ddp {
// Short names for the benchmarks and tests that include this header.
using kernels::cuda::gemm_options;
using kernels::cuda::GemmOptions;
using kernels::cuda::set_gemm_options;
}  // namespace ddp
