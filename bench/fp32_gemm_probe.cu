// Can a plain FP32 (SIMT) GEMM of our own beat cuBLAS at the big model's shapes? The 784-1024-1024-10 batch-256
// FP32 step is mostly its five wide GEMMs, which cuBLAS runs at a fraction of the GPU's FP32 rate because their
// outputs have few tiles. This probe times one simple tiled kernel (64 x 64 tiles, 4 x 4 per thread, K split so
// the tiles times the split fill about two waves, the parts added in order by a second kernel) against
// cublasSgemm on each shape, in the same run, and checks it against cuBLAS's result. A measurement for deciding
// whether to write the real kernels, not a kernel the runtime uses.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "bench/timing.h"
#include "runtime/core/check.h"
#include "runtime/kernels/cuda/cublas_check.h"

namespace ddp::bench {
namespace {

constexpr int kTile = 64;
constexpr int kDepth = 16;
constexpr int kThreads = 256;

// One operand's tile into shared memory: tile[kk][r] = element (r0 + r, k0 + kk), stored at p[row + k·ld] (rows
// contiguous) or p[k + row·ld] (`kDepthContiguous`); zero outside rows [0, rows) and depths [k0, k_end). The
// threads run along the contiguous direction, so the loads coalesce.
template <bool kDepthContiguous>
__device__ __forceinline__ void load_tile(const float* __restrict__ p, int ld, int rows, int r0, int k0, int k_end,
                                          float (&tile)[kDepth][kTile]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int kk = kDepthContiguous ? tid % kDepth : tid / kTile + 4 * pass;
    const int r = kDepthContiguous ? tid / kDepth + 16 * pass : tid % kTile;
    const int row = r0 + r, depth = k0 + kk;
    float v = 0.0f;
    if (row < rows && depth < k_end)
      v = kDepthContiguous ? p[depth + static_cast<long>(row) * ld] : p[row + static_cast<long>(depth) * ld];
    tile[kk][r] = v;
  }
}

// Column-major C[m, n] (or part `blockIdx.z` of it) = op(A)[m, k-range] · op(B)[k-range, n]. op(A)(i, k) is
// A[i + k·lda] (N) or A[k + i·lda] (T); op(B)(k, j) is B[k + j·ldb] (N) or B[j + k·ldb] (T).
template <bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kThreads) tiled_sgemm(int m, int n, int k, int chunk, const float* __restrict__ a,
                                                        int lda, const float* __restrict__ b, int ldb,
                                                        float* __restrict__ c) {
  __shared__ __align__(16) float as[kDepth][kTile];
  __shared__ __align__(16) float bs[kDepth][kTile];
  const int i0 = blockIdx.x * kTile, j0 = blockIdx.y * kTile;
  const int k_begin = blockIdx.z * chunk, k_end = min(k, k_begin + chunk);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int k0 = k_begin; k0 < k_end; k0 += kDepth) {
    load_tile<kTransA>(a, lda, m, i0, k0, k_end, as);
    load_tile<!kTransB>(b, ldb, n, j0, k0, k_end, bs);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&as[kk][tx * 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&bs[kk][ty * 4]);
      const float ar[4] = {av.x, av.y, av.z, av.w};
      const float br[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(ar[x], br[y], acc[x][y]);
    }
    __syncthreads();
  }
  float* out = c + static_cast<long>(blockIdx.z) * m * n;
#pragma unroll
  for (int y = 0; y < 4; ++y) {
    const int gj = j0 + ty * 4 + y;
    if (gj >= n) continue;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int gi = i0 + tx * 4 + x;
      if (gi < m) out[gi + static_cast<long>(gj) * m] = acc[x][y];
    }
  }
}

// c = Σ parts, in part order.
__global__ void add_parts(const float* __restrict__ parts, int count, long elements, float* __restrict__ c) {
  for (long e = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; e < elements;
       e += static_cast<long>(gridDim.x) * blockDim.x) {
    float s = parts[e];
    for (int p = 1; p < count; ++p) s += parts[p * elements + e];
    c[e] = s;
  }
}

struct Shape {
  const char* name;
  bool ta, tb;
  int m, n, k;
  int lda() const { return ta ? k : m; }
  int ldb() const { return tb ? n : k; }
};

using Kernel = void (*)(int, int, int, int, const float*, int, const float*, int, float*);
// tiled_sgemm for each [transposed A][transposed B].
constexpr Kernel kKernels[2][2] = {{tiled_sgemm<false, false>, tiled_sgemm<false, true>},
                                   {tiled_sgemm<true, false>, tiled_sgemm<true, true>}};

void ours(const Shape& s, int split, const float* a, const float* b, float* parts, float* c, cudaStream_t stream) {
  const int chunk = ((s.k + split - 1) / split + kDepth - 1) / kDepth * kDepth;
  const dim3 grid((s.m + kTile - 1) / kTile, (s.n + kTile - 1) / kTile, split);
  kKernels[s.ta][s.tb]<<<grid, kThreads, 0, stream>>>(s.m, s.n, s.k, chunk, a, s.lda(), b, s.ldb(),
                                                       split == 1 ? c : parts);
  if (split > 1) add_parts<<<264, 256, 0, stream>>>(parts, split, static_cast<long>(s.m) * s.n, c);
}

// The best of five timings of `iters` calls, after ten calls of warm-up.
float best_time_us(const std::function<void()>& work, int iters, const Stream& stream) {
  for (int i = 0; i < 10; ++i) work();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) best = std::min(best, time_per_call_us(work, iters, stream));
  return static_cast<float>(best);
}

void run() {
  // The big model's wide GEMMs as linear.cu states them (column-major): the forwards of its two hidden layers,
  // the second layer's dw and dx, the first layer's dw.
  const std::vector<Shape> shapes = {{"forward 784->1024", true, false, 1024, 256, 784},
                                     {"forward 1024->1024", true, false, 1024, 256, 1024},
                                     {"dw 1024x1024", false, true, 1024, 1024, 256},
                                     {"dx 1024->1024", false, false, 1024, 256, 1024},
                                     {"dw 1024x784", false, true, 784, 1024, 256}};
  const Stream owned = Stream::create(Device::cuda(0));
  cudaStream_t stream = owned.handle();
  cublasHandle_t handle;
  DDP_CUBLAS_CHECK(cublasCreate(&handle));
  DDP_CUBLAS_CHECK(cublasSetStream(handle, stream));
  DDP_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));  // FP32 on the SIMT units, no TF32
  const long most = 1024L * 1024L;
  float *a, *b, *c_ref, *c, *parts;
  DDP_CUDA_CHECK(cudaMalloc(&a, most * 4));
  DDP_CUDA_CHECK(cudaMalloc(&b, most * 4));
  DDP_CUDA_CHECK(cudaMalloc(&c_ref, most * 4));
  DDP_CUDA_CHECK(cudaMalloc(&c, most * 4));
  DDP_CUDA_CHECK(cudaMalloc(&parts, 16 * most * 4));
  std::vector<float> host(most);
  for (long i = 0; i < most; ++i) host[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  DDP_CUDA_CHECK(cudaMemcpy(a, host.data(), most * 4, cudaMemcpyHostToDevice));
  for (long i = 0; i < most; ++i) host[i] = static_cast<float>((i * 40503u + 7) % 1999) / 999.5f - 1.0f;
  DDP_CUDA_CHECK(cudaMemcpy(b, host.data(), most * 4, cudaMemcpyHostToDevice));
  // A pageable upload may still be in flight when cudaMemcpy returns, and `stream` is non-blocking: wait for it.
  DDP_CUDA_CHECK(cudaDeviceSynchronize());
  float total_ref = 0.0f, total_ours = 0.0f;
  for (const Shape& s : shapes) {
    const float one = 1.0f, zero = 0.0f;
    auto reference = [&] {
      DDP_CUBLAS_CHECK(cublasSgemm(handle, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.m,
                                   s.n, s.k, &one, a, s.lda(), b, s.ldb(), &zero, c_ref, s.m));
    };
    const float t_ref = best_time_us(reference, 200, owned);
    const int tiles = ((s.m + kTile - 1) / kTile) * ((s.n + kTile - 1) / kTile);
    float best = 1e30f;
    int best_split = 1;
    for (int split : {1, 2, 4, 8}) {
      if (tiles * split > 4 * 132 || s.k / split < kDepth) continue;
      const float t = best_time_us([&] { ours(s, split, a, b, parts, c, stream); }, 200, owned);
      std::printf("  %-20s split %d: %.1f us\n", s.name, split, t);
      if (t < best) best = t, best_split = split;
    }
    ours(s, best_split, a, b, parts, c, stream);
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> got(static_cast<long>(s.m) * s.n), want(got.size());
    DDP_CUDA_CHECK(cudaMemcpy(got.data(), c, got.size() * 4, cudaMemcpyDeviceToHost));
    DDP_CUDA_CHECK(cudaMemcpy(want.data(), c_ref, want.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
      den += static_cast<double>(want[i]) * want[i];
    }
    std::printf("%-20s m=%d n=%d k=%d: cublasSgemm %.1f us, ours %.1f us (split %d), %.2fx, relative L2 difference %.2g\n",
                s.name, s.m, s.n, s.k, t_ref, best, best_split, t_ref / best, std::sqrt(num / den));
    total_ref += t_ref;
    total_ours += best;
  }
  std::printf("five GEMMs: cublasSgemm %.1f us, ours %.1f us, %.2fx\n", total_ref, total_ours, total_ref / total_ours);
}

}  // namespace
}  // namespace ddp::bench

int main() {
  try {
    ddp::bench::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp32_gemm_probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
