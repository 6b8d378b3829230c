// The cuBLASLt handle and the GEMM workspace every linear op runs with.
//
// Why a shared owner: creating a handle or allocating a workspace is slow and, during CUDA-graph capture,
// illegal. Both are created lazily on the first call and then reused forever, so steady-state GEMMs neither
// allocate nor synchronise. The handle is one per device (cuBLASLt handles hold no per-call state, the stream is
// an argument of every call, so threads can share one). The workspace is one per (device, stream): two streams
// running GEMMs concurrently must never share scratch memory, while work on one stream is ordered and can.
#pragma once

#include <cstddef>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace ddp::kernels::cuda {

// 32 MiB: enough for every split-K / stream-K configuration cuBLASLt's heuristics pick on Hopper.
inline constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;
// Small per-stream scratch for the two-pass deterministic reductions (losses, sum of squares, bias gradients):
// partial results from the first pass, summed in a fixed order by the second. Its last kReductionCounterBytes
// are counters, zero when the scratch is created, that every kernel using them leaves at zero again (the
// "last block finishes the reduction" pattern of the bias gradient), so graph replays find them zero too.
inline constexpr std::size_t kReductionScratchBytes = std::size_t{1} << 20;
inline constexpr std::size_t kReductionCounterBytes = 4096;

struct BlasContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// The handle for the current device and the workspace bound to `stream` (created on first use).
BlasContext blas_context(cudaStream_t stream);

// kReductionScratchBytes of device memory bound to (current device, `stream`), 256-byte aligned.
void* reduction_scratch(cudaStream_t stream);

// The counters at the end of that scratch (kReductionCounterBytes / 4 of them, zero between kernels).
inline unsigned int* reduction_counters(cudaStream_t stream) {
  return reinterpret_cast<unsigned int*>(static_cast<char*>(reduction_scratch(stream)) + kReductionScratchBytes -
                                         kReductionCounterBytes);
}

}  // namespace ddp::kernels::cuda
