// Elementwise activations: the standalone float32 kernels of the contract (activation_forward/backward) and the
// bias/activation kernels linear.cu places around its GEMMs (activation_kernels.h).
//
// GELU is the exact erf form (torch.nn.GELU() default). cuBLASLt's GELU epilogues compute the tanh
// approximation, which differs by up to ~1e-3 relative, so the GELU of a Linear is done here, not in the GEMM.
#include <algorithm>

#include "runtime/kernels/cuda/activation_kernels.h"
#include "runtime/kernels/cuda/blas_handle.h"
#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace detail {
namespace {

// ---- standalone float32 activations, float4 when every pointer allows it ----
// No __restrict__: callers may run them in place (y == x, dx == dy); each element is read before it is written.

__global__ void activation_forward_kernel(Activation act, const float* x, float* y,
                                          std::int64_t n, bool vectorized) {
  detail::begin_kernel();
  auto f = [act](float z) { return apply_activation(act, z); };
  for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) { reinterpret_cast<float4*>(y)[v] = map4(reinterpret_cast<const float4*>(x)[v], f); },
      [&](std::int64_t i) { y[i] = f(x[i]); });
}

// `saved` is what activation_grad differentiates from (device_utils.cuh).
__global__ void activation_backward_kernel(Activation act, const float* saved, const float* dy,
                                           float* dx, std::int64_t n, bool accumulate, bool vectorized) {
  detail::begin_kernel();
  auto grad = [act](float s, float g) { return g * activation_grad(act, s); };
  for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) {
        float4* dx4 = reinterpret_cast<float4*>(dx);
        float4 r = map4(reinterpret_cast<const float4*>(saved)[v], reinterpret_cast<const float4*>(dy)[v], grad);
        if (accumulate) r = map4(dx4[v], r, [](float o, float d) { return o + d; });
        dx4[v] = r;
      },
      [&](std::int64_t i) {
        const float r = grad(saved[i], dy[i]);
        dx[i] = accumulate ? dx[i] + r : r;
      });
}

// ---- Linear helpers ----

template <typename T>
__global__ void bias_activation_kernel(Activation act, const T* z_in, const T* __restrict__ bias, T* pre_out, T* y,
                                       std::int64_t rows, std::int64_t cols) {
  detail::begin_kernel();
  // No __restrict__ on z_in/pre_out/y: they may alias (in-place); each element is read before it is written.
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float z = to_float(z_in[i]);
    if (bias != nullptr) z += to_float(bias[i % cols]);
    // bf16: pre_activation is stored rounded, and the activation is computed from the rounded value, so the
    // backward (which reads the stored value) differentiates exactly the function the forward applied.
    const T z_stored = from_float<T>(z);
    if (pre_out != nullptr) pre_out[i] = z_stored;
    y[i] = from_float<T>(apply_activation(act, to_float(z_stored)));
  }
}

constexpr int kColTile = 32;  // columns per block: one warp reads 32 consecutive elements of a row
constexpr int kRowLanes = 8;  // rows processed concurrently per block

// The end of both bias-gradient kernels. Block (bx, by) holds, in the threads where `holds` is true, `total`: the
// sum of column `col` over its chunk of rows. With one chunk (gridDim.y == 1) that is dbias[col]; with several,
// each block writes partials[by][col] and the last block of column tile bx to finish (counted in counters[bx])
// adds the partials in chunk order: deterministic, and one launch instead of two. Call from every thread.
template <typename TB>
__device__ void finish_column_sums(float total, bool holds, std::int64_t col, std::int64_t cols, TB* dbias,
                                   float* partials, unsigned int* counters, bool accumulate) {
  if (gridDim.y == 1) {
    if (holds) dbias[col] = from_float<TB>(accumulate ? total + to_float(dbias[col]) : total);
    return;
  }
  if (holds) partials[static_cast<std::int64_t>(blockIdx.y) * cols + col] = total;
  if (!arrived_last(&counters[blockIdx.x], gridDim.y)) return;
  if (holds) {
    float all = 0.0f;
    for (unsigned int c = 0; c < gridDim.y; ++c) all += __ldcg(&partials[static_cast<std::int64_t>(c) * cols + col]);
    dbias[col] = from_float<TB>(accumulate ? all + to_float(dbias[col]) : all);
  }
}

// Block (bx, by) covers columns [32·bx, 32·bx + 32) and rows [by·rows_per_chunk, ...). It writes dz (when there
// is an activation, or a dz to convert into) and the chunk's column sums (finish_column_sums). TDy is dy's and
// saved's type, TDz dz's, TB dbias's.
template <typename TDy, typename TDz, typename TB>
__global__ void activation_grad_bias_kernel(Activation act, const TDy* dy, const TDy* __restrict__ saved, TDz* dz,
                                            TB* __restrict__ dbias, float* __restrict__ partials,
                                            unsigned int* __restrict__ counters, bool accumulate, std::int64_t rows,
                                            std::int64_t cols, std::int64_t rows_per_chunk) {
  detail::begin_kernel();
  __shared__ float sums[kRowLanes][kColTile + 1];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t row_begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t row_end = min(rows, row_begin + rows_per_chunk);
  float sum = 0.0f;
  if (col < cols) {
    for (std::int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      const std::int64_t i = r * cols + col;
      float g = to_float(dy[i]);
      if (act != Activation::kNone) g *= activation_grad(act, to_float(saved[i]));
      if (dz != nullptr) {
        const TDz stored = from_float<TDz>(g);
        dz[i] = stored;
        g = to_float(stored);  // the bias gradient sums exactly the dz the weight GEMM will read
      }
      sum += g;
    }
  }
  if (dbias == nullptr) return;
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  const bool holds = threadIdx.y == 0 && col < cols;  // the first row of threads finishes the columns
  float total = 0.0f;
  if (holds)
    for (int k = 0; k < kRowLanes; ++k) total += sums[k][threadIdx.x];
  finish_column_sums(total, holds, col, cols, dbias, partials, counters, accumulate);
}

// The reduction scratch's counters: a two-level bias gradient needs one per column tile.
constexpr std::int64_t kCounters = kReductionCounterBytes / sizeof(unsigned int);

template <typename TDy, typename TDz, typename TB>
void activation_grad_bias_typed(Activation act, const void* dy, const void* saved, void* dz, void* dbias,
                                bool accumulate, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) {
    // An empty batch still owes a defined bias gradient: zero (or unchanged when accumulating).
    if (dbias != nullptr && !accumulate && cols > 0)
      DDP_CUDA_CHECK(cudaMemsetAsync(dbias, 0, static_cast<std::size_t>(cols) * sizeof(TB), stream));
    return;
  }
  if (act == Activation::kNone && dbias == nullptr && dz == nullptr) return;  // nothing to do: dz is dy
  // Enough row chunks to fill the GPU; with a bias gradient, bounded by the scratch for the partial sums (and
  // one row chunk when there are more column tiles than counters).
  constexpr std::int64_t kRowsPerChunkMin = 64;
  const std::int64_t col_blocks = (cols + kColTile - 1) / kColTile;
  std::int64_t chunks = (rows + kRowsPerChunkMin - 1) / kRowsPerChunkMin;
  if (dbias != nullptr && col_blocks > kCounters) {
    chunks = 1;
  } else if (dbias != nullptr) {
    const std::int64_t by_scratch =
        static_cast<std::int64_t>((kReductionScratchBytes - kReductionCounterBytes) /
                                  (sizeof(float) * static_cast<std::size_t>(cols)));
    chunks = std::min<std::int64_t>({chunks, 64, std::max<std::int64_t>(by_scratch, 1)});
  } else {
    chunks = std::min<std::int64_t>(chunks, 65535);
  }
  const std::int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const bool two_level = dbias != nullptr && chunks > 1;
  float* partials = two_level ? static_cast<float*>(reduction_scratch(stream)) : nullptr;
  unsigned int* counters = two_level ? reduction_counters(stream) : nullptr;
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(chunks));
  detail::launch(activation_grad_bias_kernel<TDy, TDz, TB>, grid, block, 0, stream, act, static_cast<const TDy*>(dy),
                 static_cast<const TDy*>(saved), static_cast<TDz*>(dz), static_cast<TB*>(dbias), partials, counters,
                 accumulate, rows, cols, rows_per_chunk);
}

void check_float_type(DType dtype, const char* what) {
  DDP_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
            std::string(what) + ": dtype must be float32 or bfloat16");
}

}  // namespace

void bias_activation(DType dtype, Activation act, const void* z_in, const void* bias, void* pre_out, void* y,
                     std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  check_float_type(dtype, "bias_activation");
  const std::int64_t n = rows * cols;
  if (n <= 0) return;
  if (dtype == DType::kFloat32) {
    detail::launch(bias_activation_kernel<float>, blocks_for(n), kThreads, 0, stream, act,
                   static_cast<const float*>(z_in), static_cast<const float*>(bias), static_cast<float*>(pre_out),
                   static_cast<float*>(y), rows, cols);
  } else {
    detail::launch(bias_activation_kernel<__nv_bfloat16>, blocks_for(n), kThreads, 0, stream, act,
                   static_cast<const __nv_bfloat16*>(z_in), static_cast<const __nv_bfloat16*>(bias),
                   static_cast<__nv_bfloat16*>(pre_out), static_cast<__nv_bfloat16*>(y), rows, cols);
  }
}

void activation_grad_bias(DType dy_type, DType dz_type, DType bias_type, Activation act,
                          const void* dy, const void* saved, void* dz, void* dbias, bool accumulate,
                          std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  check_float_type(dy_type, "activation_grad_bias");
  check_float_type(dz_type, "activation_grad_bias");
  check_float_type(bias_type, "activation_grad_bias");
  if (act != Activation::kNone) {
    DDP_ASSERT(saved != nullptr, "linear_backward: the activation's saved tensor (y or pre_activation) is null");
    DDP_ASSERT(dz != nullptr, "linear_backward: scratch_dz is required when the activation is not kNone");
  }
  using F = float;
  using B = __nv_bfloat16;
  const bool f_dy = dy_type == DType::kFloat32, f_dz = dz_type == DType::kFloat32,
             f_b = bias_type == DType::kFloat32;
  auto run = [&](auto dy_tag, auto dz_tag, auto b_tag) {
    activation_grad_bias_typed<decltype(dy_tag), decltype(dz_tag), decltype(b_tag)>(act, dy, saved, dz, dbias,
                                                                                   accumulate, rows, cols, stream);
  };
  if (f_dy && f_dz && f_b) return run(F{}, F{}, F{});
  if (!f_dy && !f_dz && !f_b) return run(B{}, B{}, B{});
  if (!f_dy && !f_dz && f_b) return run(B{}, B{}, F{});
  if (f_dy && !f_dz && f_b) return run(F{}, B{}, F{});
  if (f_dy && !f_dz && !f_b) return run(F{}, B{}, B{});
  throw Error("activation_grad_bias: unsupported type combination (a float32 dz from a bfloat16 dy)", __FILE__,
              __LINE__);
}

}  // namespace detail

void activation_forward(Activation act, const float* x, float* y, std::int64_t n, StreamHandle stream) {
  if (n <= 0) return;
  const bool vectorized = detail::aligned16(x) && detail::aligned16(y);
  detail::launch(detail::activation_forward_kernel, detail::blocks_by_four(n, vectorized), detail::kThreads, 0, stream,
                 act, x, y, n, vectorized);
}

void activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx,
                         std::int64_t n, bool accumulate, StreamHandle stream) {
  if (n <= 0) return;
  // What activation_grad differentiates from: the output for tanh and sigmoid, the input otherwise.
  const float* saved = act == Activation::kTanh || act == Activation::kSigmoid ? y : x;
  const bool vectorized = detail::aligned16(saved) && detail::aligned16(dy) && detail::aligned16(dx);
  detail::launch(detail::activation_backward_kernel, detail::blocks_by_four(n, vectorized), detail::kThreads, 0, stream,
                 act, saved, dy, dx, n, accumulate, vectorized);
}

}  // namespace ddp::kernels::cuda
