#include "examples/in_situ_heat_kernels.h"

#include <cuda_runtime.h>

#include "examples/in_situ_heat.h"
#include "runtime/core/check.h"

namespace in_situ {
namespace {

constexpr int kThreads = 256;

__global__ void heat_rows_kernel(const float* u, float* next, long long cols, long long first, long long cells) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i >= cells) return;
  const long long r = first + i / cols, c = 1 + i % cols;
  next[r * (cols + 2) + c] = next_value(u, cols + 2, r, c);
}

__global__ void sample_cells_kernel(const float* u, long long rows, long long cols, std::uint64_t key,
                                    long long count, float* x, float* y) {
  const long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (i < count) sample_cell(u, rows, cols, key, i, x + i * kInputs, y + i);
}

unsigned blocks(long long n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void heat_rows_cuda(const float* u, float* next, long long cols, long long first, long long last,
                    CUstream_st* stream) {
  const long long cells = (last - first + 1) * cols;
  if (cells <= 0) return;
  heat_rows_kernel<<<blocks(cells), kThreads, 0, stream>>>(u, next, cols, first, cells);
  DDP_CUDA_CHECK_LAUNCH();
}

void sample_cells_cuda(const float* u, long long rows, long long cols, std::uint64_t key, long long count, float* x,
                       float* y, CUstream_st* stream) {
  if (count <= 0) return;
  sample_cells_kernel<<<blocks(count), kThreads, 0, stream>>>(u, rows, cols, key, count, x, y);
  DDP_CUDA_CHECK_LAUNCH();
}

}  // namespace in_situ
