// How every kernel of runtime/kernels/cuda is launched: through launch(), which lets a kernel start while the
// kernel before it on the stream is still draining (programmatic dependent launch, sm_90), and each kernel's first
// statement is begin_kernel(), which waits for that kernel's results before touching memory.
//
// Why: a training step of a small model is a chain of short, dependent kernels, and between two of them the GPU
// would otherwise sit idle while the first one's last blocks retire, its writes are flushed and the second one's
// blocks are set up. With the launch attribute the second kernel's blocks are resident and waiting when the
// first one ends; a CUDA graph captured from the stream keeps the same edges. The wait in begin_kernel() covers
// the whole previous grid and its memory, so the arithmetic and its order do not change; a kernel launched
// without the attribute (DDP_KERNEL_PDL=0, or any other launch) passes straight through it.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"

namespace ddp::kernels::cuda::detail {

// DDP_KERNEL_PDL=0 (runtime/core/settings.h) launches every kernel in plain stream order (for measuring one
// against the other).
inline bool dependent_launches() {
  static constexpr const settings::Setting& pdl = settings::setting("DDP_KERNEL_PDL");
  static const bool enabled = settings::flag(pdl);
  return enabled;
}

// The first statement of every kernel launched through launch(): wait until the kernel before it has finished
// and its writes are visible, then let the kernel after it be launched (its blocks wait in their own
// begin_kernel(), so letting it launch this early is safe: all of this grid's blocks are already resident).
__device__ __forceinline__ void begin_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), allowed to overlap the previous kernel's end.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = dependent_launches() ? 1 : 0;
  DDP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace ddp::kernels::cuda::detail
