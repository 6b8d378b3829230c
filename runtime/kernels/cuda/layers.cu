// CUDA kernels of the MLP-family layers (LayerNorm, frequency encoding, dropout, embedding, column copies), the
// twins of runtime/kernels/cpu/layers.cc. Every launch shape depends on the problem size only, no kernel uses a
// float atomic, and none allocates or reads the host, so each is graph-capturable and gives the same bits on
// every run. Products that the CPU rounds separately are written with _rn intrinsics so nvcc cannot fuse them.
#include <algorithm>
#include <cstdint>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cuda/blas_handle.h"
#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

using detail::blocks_for;
using detail::kThreads;

__device__ __forceinline__ std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// ---- LayerNorm: one block per row (rows are independent; widths up to a few thousand fit a block's loop) ----
constexpr int kRowThreads = 256;

// The sum of `v` over the block, in every thread (block_sum leaves it in thread 0 only).
__device__ __forceinline__ float row_sum(float v, float* shared, float* broadcast) {
  const float total = detail::block_sum(v, shared);
  if (threadIdx.x == 0) *broadcast = total;
  __syncthreads();
  const float all = *broadcast;
  __syncthreads();
  return all;
}

__global__ void layer_norm_forward_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                          const float* __restrict__ bias, std::int64_t cols, float eps,
                                          float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd) {
  detail::begin_kernel();
  __shared__ float shared[32];
  __shared__ float broadcast;
  const std::int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float s = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  const float m = row_sum(s, shared, &broadcast) / static_cast<float>(cols);
  float q = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = xr[c] - m;
    q = __fmaf_rn(d, d, q);
  }
  const float var = row_sum(q, shared, &broadcast) / static_cast<float>(cols);
  const float rs = 1.0f / sqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  float* yr = y + r * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = __fmul_rn(xr[c] - m, rs);
    if (weight != nullptr) v = __fmul_rn(v, weight[c]);
    if (bias != nullptr) v = __fadd_rn(v, bias[c]);
    yr[c] = v;
  }
}

__global__ void layer_norm_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                     const float* __restrict__ weight, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, std::int64_t cols, float* dx, bool accumulate) {
  detail::begin_kernel();
  __shared__ float shared[32];
  __shared__ float broadcast;
  const std::int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  const float* dyr = dy + r * cols;
  const float m = mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = __fmul_rn(xr[c] - m, rs);
    const float g = weight != nullptr ? __fmul_rn(dyr[c], weight[c]) : dyr[c];
    sg += g;
    sgx = __fmaf_rn(g, xhat, sgx);
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float mean_g = row_sum(sg, shared, &broadcast) * inv_cols;
  const float mean_gx = row_sum(sgx, shared, &broadcast) * inv_cols;
  float* dxr = dx + r * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = __fmul_rn(xr[c] - m, rs);
    const float g = weight != nullptr ? __fmul_rn(dyr[c], weight[c]) : dyr[c];
    const float v = __fmul_rn(rs, g - mean_g - __fmul_rn(xhat, mean_gx));
    dxr[c] = accumulate ? dxr[c] + v : v;
  }
}

// dweight and dbias: block (bx, by) sums columns [32·bx, 32·bx + 32) over its chunk of rows, 8 rows at a time
// (rows ty, ty + 8, ... of the chunk in thread row ty, then the 8 thread rows in order). With one chunk that is
// the result; with several, each block writes its chunk's sums into `partials` and the last block of the column
// tile to finish (counted in counters[bx]) adds them in chunk order. A fixed order throughout: the same bits on
// every run, one launch, and enough blocks to fill the GPU when the batch is large and the layer narrow.
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;

__global__ void layer_norm_params_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         std::int64_t rows, std::int64_t cols, std::int64_t rows_per_chunk,
                                         float* dweight, bool accumulate_dweight, float* dbias, bool accumulate_dbias,
                                         float* __restrict__ partials, unsigned int* __restrict__ counters) {
  detail::begin_kernel();
  __shared__ float sums_w[kRowLanes][kColTile + 1];
  __shared__ float sums_b[kRowLanes][kColTile + 1];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t row_begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t row_end = min(rows, row_begin + rows_per_chunk);
  float sw = 0.0f, sb = 0.0f;
  if (col < cols) {
    for (std::int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      const float g = dy[r * cols + col];
      sw = __fadd_rn(sw, __fmul_rn(g, __fmul_rn(x[r * cols + col] - mean[r], rstd[r])));
      sb = __fadd_rn(sb, g);
    }
  }
  sums_w[threadIdx.y][threadIdx.x] = sw;
  sums_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  const bool holds = threadIdx.y == 0 && col < cols;
  float tw = 0.0f, tb = 0.0f;
  if (holds) {
    for (int k = 0; k < kRowLanes; ++k) {
      tw += sums_w[k][threadIdx.x];
      tb += sums_b[k][threadIdx.x];
    }
  }
  if (gridDim.y > 1) {
    const std::int64_t chunks = gridDim.y;
    if (holds) {
      partials[static_cast<std::int64_t>(blockIdx.y) * cols + col] = tw;
      partials[(chunks + blockIdx.y) * cols + col] = tb;
    }
    if (!detail::arrived_last(&counters[blockIdx.x], gridDim.y)) return;
    if (!holds) return;
    tw = 0.0f;
    tb = 0.0f;
    for (std::int64_t c = 0; c < chunks; ++c) {
      tw += __ldcg(&partials[c * cols + col]);
      tb += __ldcg(&partials[(chunks + c) * cols + col]);
    }
  }
  if (!holds) return;
  if (dweight != nullptr) dweight[col] = accumulate_dweight ? __fadd_rn(dweight[col], tw) : tw;
  if (dbias != nullptr) dbias[col] = accumulate_dbias ? __fadd_rn(dbias[col], tb) : tb;
}

// ---- Frequency encoding: one thread per input element writes (and reads) all of its output columns ----
__device__ __forceinline__ float frequency(std::int64_t k) {
  return static_cast<float>(ldexp(3.14159265358979323846, static_cast<int>(k)));
}

__global__ void frequency_encoding_forward_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t in,
                                                  std::int64_t frequencies, bool include_input, float* __restrict__ y) {
  detail::begin_kernel();
  const std::int64_t out = in * ((include_input ? 1 : 0) + 2 * frequencies);
  for (std::int64_t e = thread_index(); e < rows * in; e += grid_stride()) {
    const std::int64_t r = e / in, c = e - r * in;
    const float v = x[e];
    float* yr = y + r * out + c;
    if (include_input) {
      yr[0] = v;
      yr += in;
    }
    for (std::int64_t k = 0; k < frequencies; ++k) {
      const float arg = __fmul_rn(frequency(k), v);
      yr[0] = sinf(arg);
      yr[in] = cosf(arg);
      yr += 2 * in;
    }
  }
}

__global__ void frequency_encoding_backward_kernel(const float* __restrict__ x, const float* __restrict__ dy,
                                                   std::int64_t rows, std::int64_t in, std::int64_t frequencies,
                                                   bool include_input, float* dx, bool accumulate) {
  detail::begin_kernel();
  const std::int64_t out = in * ((include_input ? 1 : 0) + 2 * frequencies);
  for (std::int64_t e = thread_index(); e < rows * in; e += grid_stride()) {
    const std::int64_t r = e / in, c = e - r * in;
    const float v = x[e];
    const float* g = dy + r * out + c;
    float sum = include_input ? g[0] : 0.0f;
    if (include_input) g += in;
    for (std::int64_t k = 0; k < frequencies; ++k) {
      const float a = frequency(k);
      const float arg = __fmul_rn(a, v);
      const float term = __fsub_rn(__fmul_rn(g[0], cosf(arg)), __fmul_rn(g[in], sinf(arg)));
      sum = __fadd_rn(sum, __fmul_rn(a, term));
      g += 2 * in;
    }
    dx[e] = accumulate ? __fadd_rn(dx[e], sum) : sum;
  }
}

// ---- Dropout ----
__global__ void dropout_forward_kernel(const float* __restrict__ x, std::int64_t n, float p, float scale,
                                       std::uint64_t seed, const std::int64_t* __restrict__ draw,
                                       float* __restrict__ y, float* __restrict__ mask) {
  detail::begin_kernel();
  const auto d = static_cast<std::uint64_t>(*draw);
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) {
    const float m = counter_rng::dropout_keeps(seed, d, static_cast<std::uint64_t>(i), p) ? scale : 0.0f;
    mask[i] = m;
    y[i] = __fmul_rn(x[i], m);
  }
}

__global__ void advance_counter_kernel(std::int64_t* counter, std::int64_t by) {
  detail::begin_kernel();
  *counter += by;
}

// ---- Embedding ----
__global__ void embedding_forward_kernel(const float* __restrict__ weight, std::int64_t num, std::int64_t dim,
                                         const std::int32_t* __restrict__ indices, std::int64_t n,
                                         float* __restrict__ y) {
  detail::begin_kernel();
  for (std::int64_t e = thread_index(); e < n * dim; e += grid_stride()) {
    const std::int64_t i = e / dim, c = e - i * dim;
    const std::int64_t r = indices[i];
    y[e] = r >= 0 && r < num ? weight[r * dim + c] : 0.0f;
  }
}

// One thread per element of dweight scans every index in order: no atomics, the CPU's summation order. The
// work is num·dim·n, right for categorical columns (cardinalities up to thousands), not for large vocabularies.
__global__ void embedding_backward_kernel(const float* __restrict__ dy, const std::int32_t* __restrict__ indices,
                                          std::int64_t n, std::int64_t num, std::int64_t dim, float* dweight,
                                          bool accumulate) {
  detail::begin_kernel();
  for (std::int64_t e = thread_index(); e < num * dim; e += grid_stride()) {
    const std::int64_t r = e / dim, c = e - r * dim;
    float acc = accumulate ? dweight[e] : 0.0f;
    for (std::int64_t i = 0; i < n; ++i)
      if (indices[i] == r) acc = __fadd_rn(acc, dy[i * dim + c]);
    dweight[e] = acc;
  }
}

__global__ void float_column_to_index_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t stride,
                                             std::int64_t column, std::int64_t limit, std::int32_t* __restrict__ ids) {
  detail::begin_kernel();
  for (std::int64_t r = thread_index(); r < rows; r += grid_stride()) {
    const float v = x[r * stride + column];
    const bool valid = v >= 0.0f && v < static_cast<float>(limit) && floorf(v) == v;
    ids[r] = valid ? static_cast<std::int32_t>(v) : -1;
  }
}

__global__ void copy_columns_kernel(const float* __restrict__ src, std::int64_t src_stride, float* dst,
                                    std::int64_t dst_stride, std::int64_t rows, std::int64_t cols, bool accumulate) {
  detail::begin_kernel();
  for (std::int64_t e = thread_index(); e < rows * cols; e += grid_stride()) {
    const std::int64_t r = e / cols, c = e - r * cols;
    const float v = src[r * src_stride + c];
    float& d = dst[r * dst_stride + c];
    d = accumulate ? __fadd_rn(d, v) : v;
  }
}

}  // namespace

void layer_norm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows, std::int64_t cols,
                        float eps, float* y, float* mean, float* rstd, StreamHandle stream) {
  if (rows <= 0 || cols <= 0) return;
  DDP_CHECK(rows <= 0x7fffffff, "layer_norm_forward: more than 2^31 - 1 rows");
  detail::launch(layer_norm_forward_kernel, static_cast<unsigned int>(rows), kRowThreads, 0, stream, x, weight, bias,
                 cols, eps, y, mean, rstd);
}

void layer_norm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                         std::int64_t rows, std::int64_t cols, float* dx, bool accumulate_dx, float* dweight,
                         bool accumulate_dweight, float* dbias, bool accumulate_dbias, StreamHandle stream) {
  if (cols <= 0) return;
  if (dx != nullptr && rows > 0) {
    DDP_CHECK(rows <= 0x7fffffff, "layer_norm_backward: more than 2^31 - 1 rows");
    detail::launch(layer_norm_dx_kernel, static_cast<unsigned int>(rows), kRowThreads, 0, stream, dy, x, weight, mean,
                   rstd, cols, dx, accumulate_dx);
  }
  if (dweight == nullptr && dbias == nullptr) return;
  if (rows <= 0) {  // no rows: the sums are zero
    if (dweight != nullptr && !accumulate_dweight) DDP_CUDA_CHECK(cudaMemsetAsync(dweight, 0, cols * 4, stream));
    if (dbias != nullptr && !accumulate_dbias) DDP_CUDA_CHECK(cudaMemsetAsync(dbias, 0, cols * 4, stream));
    return;
  }
  // Row chunks of at least 64 rows, at most 64 of them, bounded by the scratch for two partial sums per column
  // and by one counter per column tile (a width past that many tiles sums in one chunk).
  constexpr std::int64_t kCounters = kReductionCounterBytes / sizeof(unsigned int);
  const std::int64_t col_tiles = (cols + kColTile - 1) / kColTile;
  const std::int64_t by_scratch = static_cast<std::int64_t>((kReductionScratchBytes - kReductionCounterBytes) /
                                                            (2 * sizeof(float) * static_cast<std::size_t>(cols)));
  std::int64_t chunks = std::min<std::int64_t>({(rows + 63) / 64, 64, std::max<std::int64_t>(by_scratch, 1)});
  if (col_tiles > kCounters) chunks = 1;
  const std::int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  float* partials = chunks > 1 ? static_cast<float*>(reduction_scratch(stream)) : nullptr;
  unsigned int* counters = chunks > 1 ? reduction_counters(stream) : nullptr;
  detail::launch(layer_norm_params_kernel,
                 dim3(static_cast<unsigned int>(col_tiles), static_cast<unsigned int>(chunks)),
                 dim3(kColTile, kRowLanes), 0, stream, dy, x, mean, rstd, rows, cols, rows_per_chunk, dweight,
                 accumulate_dweight, dbias, accumulate_dbias, partials, counters);
}

void frequency_encoding_forward(const float* x, std::int64_t rows, std::int64_t in, std::int64_t frequencies,
                                bool include_input, float* y, StreamHandle stream) {
  if (rows <= 0 || in <= 0) return;
  detail::launch(frequency_encoding_forward_kernel, blocks_for(rows * in), kThreads, 0, stream, x, rows, in,
                 frequencies, include_input, y);
}

void frequency_encoding_backward(const float* x, const float* dy, std::int64_t rows, std::int64_t in,
                                 std::int64_t frequencies, bool include_input, float* dx, bool accumulate,
                                 StreamHandle stream) {
  if (rows <= 0 || in <= 0) return;
  detail::launch(frequency_encoding_backward_kernel, blocks_for(rows * in), kThreads, 0, stream, x, dy, rows, in,
                 frequencies, include_input, dx, accumulate);
}

void dropout_forward(const float* x, std::int64_t n, float p, float scale, std::uint64_t seed,
                     const std::int64_t* draw, float* y, float* mask, StreamHandle stream) {
  if (n <= 0) return;
  detail::launch(dropout_forward_kernel, blocks_for(n), kThreads, 0, stream, x, n, p, scale, seed, draw, y, mask);
}

void advance_counter(std::int64_t* counter, std::int64_t by, StreamHandle stream) {
  detail::launch(advance_counter_kernel, 1, 1, 0, stream, counter, by);
}

void embedding_forward(const float* weight, std::int64_t num, std::int64_t dim, const std::int32_t* indices,
                       std::int64_t n, float* y, StreamHandle stream) {
  if (n <= 0 || dim <= 0) return;
  detail::launch(embedding_forward_kernel, blocks_for(n * dim), kThreads, 0, stream, weight, num, dim, indices, n, y);
}

void embedding_backward(const float* dy, const std::int32_t* indices, std::int64_t n, std::int64_t num,
                        std::int64_t dim, float* dweight, bool accumulate, StreamHandle stream) {
  if (num <= 0 || dim <= 0) return;
  detail::launch(embedding_backward_kernel, blocks_for(num * dim), kThreads, 0, stream, dy, indices, n < 0 ? 0 : n,
                 num, dim, dweight, accumulate);
}

void float_column_to_index(const float* x, std::int64_t rows, std::int64_t stride, std::int64_t column,
                           std::int64_t limit, std::int32_t* ids, StreamHandle stream) {
  if (rows <= 0) return;
  detail::launch(float_column_to_index_kernel, blocks_for(rows), kThreads, 0, stream, x, rows, stride, column, limit,
                 ids);
}

void copy_columns(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t rows,
                  std::int64_t cols, bool accumulate, StreamHandle stream) {
  if (rows <= 0 || cols <= 0) return;
  detail::launch(copy_columns_kernel, blocks_for(rows * cols), kThreads, 0, stream, src, src_stride, dst, dst_stride,
                 rows, cols, accumulate);
}

}  // namespace ddp::kernels::cuda
