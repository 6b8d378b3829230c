// Lazily created, never freed cuBLASLt handles and per-stream device scratch (see blas_handle.h for why).
//
// Nothing here is released at exit on purpose: static destructors run after the CUDA runtime may have been torn
// down, and a process-lifetime handle and a few tens of MiB per stream are what PyTorch keeps too.
#include "runtime/kernels/cuda/blas_handle.h"

#include <map>
#include <mutex>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/kernels/cuda/cublas_check.h"

namespace ddp::kernels::cuda {
namespace {

struct StreamBuffers {
  void* workspace = nullptr;
  void* scratch = nullptr;
};

std::mutex& registry_mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

std::map<int, cublasLtHandle_t>& handles() {
  static auto* h = new std::map<int, cublasLtHandle_t>;
  return *h;
}

// Keyed by (device, stream): the same stream handle value never names streams of two devices at once.
std::map<std::pair<int, cudaStream_t>, StreamBuffers>& buffers() {
  static auto* b = new std::map<std::pair<int, cudaStream_t>, StreamBuffers>;
  return *b;
}

int current_device() {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Called with the registry mutex held.
StreamBuffers& buffers_for(int device, cudaStream_t stream) {
  StreamBuffers& b = buffers()[{device, stream}];
  if (b.workspace == nullptr) {
    // One allocation for both, so a stream costs one cudaMalloc. cudaMalloc returns 256-byte aligned memory and
    // the workspace size is a multiple of 256, so the scratch is aligned as well.
    void* base = nullptr;
    DDP_CUDA_CHECK(cudaMalloc(&base, kBlasWorkspaceBytes + kReductionScratchBytes));
    b.workspace = base;
    b.scratch = static_cast<char*>(base) + kBlasWorkspaceBytes;
    // The counters at the end of the reduction scratch start at zero (see blas_handle.h); the scratch is only
    // ever used on `stream`, so zeroing it there orders it before every use.
    DDP_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(b.scratch) + kReductionScratchBytes - kReductionCounterBytes,
                                   0, kReductionCounterBytes, stream));
  }
  return b;
}

}  // namespace

BlasContext blas_context(cudaStream_t stream) {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(registry_mutex());
  cublasLtHandle_t& handle = handles()[device];
  if (handle == nullptr) DDP_CUBLAS_CHECK(cublasLtCreate(&handle));
  StreamBuffers& b = buffers_for(device, stream);
  return BlasContext{handle, b.workspace, kBlasWorkspaceBytes};
}

void* reduction_scratch(cudaStream_t stream) {
  const int device = current_device();
  std::lock_guard<std::mutex> lock(registry_mutex());
  return buffers_for(device, stream).scratch;
}

}  // namespace ddp::kernels::cuda
