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
#include <cstdlib>
#include <vector>

namespace {

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));      \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_CUBLAS(x)                                                                    \
  do {                                                                                     \
    cublasStatus_t st_ = (x);                                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, static_cast<int>(st_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

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
};

void ours(const Shape& s, int split, const float* a, const float* b, float* parts, float* c, cudaStream_t stream) {
  const int lda = s.ta ? s.k : s.m, ldb = s.tb ? s.n : s.k;
  const int chunk = ((s.k + split - 1) / split + kDepth - 1) / kDepth * kDepth;
  const dim3 grid((s.m + kTile - 1) / kTile, (s.n + kTile - 1) / kTile, split);
  float* out = split == 1 ? c : parts;
  if (s.ta && !s.tb) tiled_sgemm<true, false><<<grid, kThreads, 0, stream>>>(s.m, s.n, s.k, chunk, a, lda, b, ldb, out);
  if (!s.ta && !s.tb) tiled_sgemm<false, false><<<grid, kThreads, 0, stream>>>(s.m, s.n, s.k, chunk, a, lda, b, ldb, out);
  if (!s.ta && s.tb) tiled_sgemm<false, true><<<grid, kThreads, 0, stream>>>(s.m, s.n, s.k, chunk, a, lda, b, ldb, out);
  if (s.ta && s.tb) tiled_sgemm<true, true><<<grid, kThreads, 0, stream>>>(s.m, s.n, s.k, chunk, a, lda, b, ldb, out);
  if (split > 1) add_parts<<<264, 256, 0, stream>>>(parts, split, static_cast<long>(s.m) * s.n, c);
}

template <typename F>
float time_us(F&& f, int iters, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 10; ++i) f();
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) f();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms * 1000.0f / iters);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return best;
}

}  // namespace

int main() {
  // The big model's wide GEMMs as linear.cu states them (column-major): the forwards of its two hidden layers,
  // the second layer's dw and dx, the first layer's dw.
  const std::vector<Shape> shapes = {{"forward 784->1024", true, false, 1024, 256, 784},
                                     {"forward 1024->1024", true, false, 1024, 256, 1024},
                                     {"dw 1024x1024", false, true, 1024, 1024, 256},
                                     {"dx 1024->1024", false, false, 1024, 256, 1024},
                                     {"dw 1024x784", false, true, 784, 1024, 256}};
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  CHECK_CUBLAS(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));  // FP32 on the SIMT units, no TF32
  const long most = 1024L * 1024L;
  float *a, *b, *c_ref, *c, *parts;
  CHECK_CUDA(cudaMalloc(&a, most * 4));
  CHECK_CUDA(cudaMalloc(&b, most * 4));
  CHECK_CUDA(cudaMalloc(&c_ref, most * 4));
  CHECK_CUDA(cudaMalloc(&c, most * 4));
  CHECK_CUDA(cudaMalloc(&parts, 16 * most * 4));
  std::vector<float> host(most);
  for (long i = 0; i < most; ++i) host[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  CHECK_CUDA(cudaMemcpy(a, host.data(), most * 4, cudaMemcpyHostToDevice));
  for (long i = 0; i < most; ++i) host[i] = static_cast<float>((i * 40503u + 7) % 1999) / 999.5f - 1.0f;
  CHECK_CUDA(cudaMemcpy(b, host.data(), most * 4, cudaMemcpyHostToDevice));
  float total_ref = 0.0f, total_ours = 0.0f;
  for (const Shape& s : shapes) {
    const int lda = s.ta ? s.k : s.m, ldb = s.tb ? s.n : s.k;
    const float one = 1.0f, zero = 0.0f;
    auto reference = [&] {
      CHECK_CUBLAS(cublasSgemm(handle, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.m, s.n,
                               s.k, &one, a, lda, b, ldb, &zero, c_ref, s.m));
    };
    const float t_ref = time_us(reference, 200, stream);
    const int tiles = ((s.m + kTile - 1) / kTile) * ((s.n + kTile - 1) / kTile);
    float best = 1e30f;
    int best_split = 1;
    for (int split : {1, 2, 4, 8}) {
      if (tiles * split > 4 * 132 || s.k / split < kDepth) continue;
      const float t = time_us([&] { ours(s, split, a, b, parts, c, stream); }, 200, stream);
      std::printf("  %-20s split %d: %.1f us\n", s.name, split, t);
      if (t < best) best = t, best_split = split;
    }
    ours(s, best_split, a, b, parts, c, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<float> got(static_cast<long>(s.m) * s.n), want(got.size());
    CHECK_CUDA(cudaMemcpy(got.data(), c, got.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(want.data(), c_ref, want.size() * 4, cudaMemcpyDeviceToHost));
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
  return 0;
}
