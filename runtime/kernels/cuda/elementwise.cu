// Elementwise utilities of the kernel contract: fill, axpby, scale, add, mul, cast, sum_squares, find_nonfinite,
// gather_batch.
//
// Each is one grid-stride kernel, using 16-byte vector accesses when every pointer involved is 16-byte aligned
// (tensor views into a flat parameter buffer need not be). sum_squares is the one reduction: a fixed number of
// per-block partials (a function of n only) summed in index order by the last block to finish, so the result is
// the same bits on every run, which gradient-norm clipping needs for reproducible training.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cuda/blas_handle.h"
#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

using detail::aligned16;
using detail::blocks_by_four;
using detail::blocks_for;
using detail::for_each_by_four;
using detail::kThreads;
using detail::map4;


__device__ __forceinline__ std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// ---- fill: the value's bit pattern is computed on the host, the kernel only stores it ----
template <typename U>
__global__ void fill_kernel(U* data, std::int64_t n, U pattern, bool vectorized) {
  detail::begin_kernel();
  std::int64_t scalar_from = 0;
  if (vectorized) {
    constexpr int kPer = 16 / sizeof(U);
    union Pack {
      uint4 v;
      U e[kPer];
    } pack;
#pragma unroll
    for (int j = 0; j < kPer; ++j) pack.e[j] = pattern;
    const std::int64_t nv = n / kPer;
    uint4* d = reinterpret_cast<uint4*>(data);
    for (std::int64_t v = thread_index(); v < nv; v += grid_stride()) d[v] = pack.v;
    scalar_from = nv * kPer;
  }
  for (std::int64_t i = scalar_from + thread_index(); i < n; i += grid_stride()) data[i] = pattern;
}

template <typename U>
void launch_fill(void* data, std::int64_t n, U pattern, cudaStream_t stream) {
  const bool vectorized = aligned16(data);
  const std::int64_t work = vectorized ? (n * static_cast<std::int64_t>(sizeof(U)) + 15) / 16 : n;
  detail::launch(fill_kernel<U>, blocks_for(work), kThreads, 0, stream, static_cast<U*>(data), n, pattern, vectorized);
}

// float → bfloat16 bits, round to nearest even (NaN stays a quiet NaN).
std::uint16_t bf16_bits_rne(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// ---- axpby / scale ----
__global__ void axpby_kernel(const float* x, float* y, std::int64_t n, float alpha, float beta, bool vectorized) {
  detail::begin_kernel();
  const bool read_y = beta != 0.0f;  // beta == 0 overwrites y without reading it (y may hold NaN)
  auto one = [&](float a, float b) { return read_y ? alpha * a + beta * b : alpha * a; };
  for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) {
        float4* y4 = reinterpret_cast<float4*>(y);
        const float4 a = reinterpret_cast<const float4*>(x)[v];
        y4[v] = read_y ? map4(a, y4[v], one) : map4(a, [&](float e) { return alpha * e; });
      },
      [&](std::int64_t i) { y[i] = read_y ? one(x[i], y[i]) : alpha * x[i]; });
}

__global__ void scale_kernel(float* x, std::int64_t n, float alpha, bool vectorized) {
  detail::begin_kernel();
  auto one = [alpha](float e) { return e * alpha; };
  for_each_by_four(
      n, vectorized, [&](std::int64_t v) { reinterpret_cast<float4*>(x)[v] = map4(reinterpret_cast<float4*>(x)[v], one); },
      [&](std::int64_t i) { x[i] = one(x[i]); });
}

// ---- add / mul: y = op(a, b, y) elementwise, with the rounding spelled out (no fused multiply-add) so that the
// bits equal the CPU implementation's ----
struct AddOp {
  static constexpr bool kReadsY = false;
  __device__ float operator()(float a, float b, float) const { return __fadd_rn(a, b); }
};
struct MulOp {
  static constexpr bool kReadsY = false;
  __device__ float operator()(float a, float b, float) const { return __fmul_rn(a, b); }
};
struct MulAccumulateOp {
  static constexpr bool kReadsY = true;
  __device__ float operator()(float a, float b, float y) const { return __fadd_rn(y, __fmul_rn(a, b)); }
};

template <typename Op>
__global__ void binary_kernel(const float* a, const float* b, float* y, std::int64_t n, Op op, bool vectorized) {
  detail::begin_kernel();
  std::int64_t scalar_from = 0;
  if (vectorized) {
    const std::int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (std::int64_t v = thread_index(); v < n4; v += grid_stride()) {
      const float4 p = a4[v];
      const float4 q = b4[v];
      const float4 old = Op::kReadsY ? y4[v] : make_float4(0.f, 0.f, 0.f, 0.f);
      y4[v] = make_float4(op(p.x, q.x, old.x), op(p.y, q.y, old.y), op(p.z, q.z, old.z), op(p.w, q.w, old.w));
    }
    scalar_from = n4 * 4;
  }
  for (std::int64_t i = scalar_from + thread_index(); i < n; i += grid_stride()) {
    y[i] = op(a[i], b[i], Op::kReadsY ? y[i] : 0.0f);
  }
}

template <typename Op>
void launch_binary(const float* a, const float* b, float* y, std::int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return;
  const bool vectorized = aligned16(a) && aligned16(b) && aligned16(y);
  detail::launch(binary_kernel<Op>, blocks_for(vectorized ? (n + 3) / 4 : n), kThreads, 0, stream, a, b, y, n, op,
                 vectorized);
}

// ---- cast ----
__global__ void f32_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, std::int64_t n,
                                   bool vectorized) {
  detail::begin_kernel();
  // Vectorized: src 16-byte aligned, dst 8-byte aligned.
  for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) {
        const float4 a = reinterpret_cast<const float4*>(src)[v];
        __nv_bfloat162* d2 = reinterpret_cast<__nv_bfloat162*>(dst);
        d2[2 * v] = __floats2bfloat162_rn(a.x, a.y);
        d2[2 * v + 1] = __floats2bfloat162_rn(a.z, a.w);
      },
      [&](std::int64_t i) { dst[i] = __float2bfloat16_rn(src[i]); });
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst, std::int64_t n) {
  detail::begin_kernel();
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) dst[i] = __bfloat162float(src[i]);
}

// ---- sum_squares: per-block double partials, summed in order by the last block to finish ----
constexpr int kMaxPartials = 1024;

__global__ void sum_squares_kernel(const float* __restrict__ x, std::int64_t n, double* __restrict__ partials,
                                   unsigned int* counter, double* __restrict__ out, bool vectorized) {
  detail::begin_kernel();
  __shared__ double shared[32];
  double acc = 0.0;
  for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) {
        const float4 a = reinterpret_cast<const float4*>(x)[v];
        acc += static_cast<double>(a.x) * a.x + static_cast<double>(a.y) * a.y + static_cast<double>(a.z) * a.z +
               static_cast<double>(a.w) * a.w;
      },
      [&](std::int64_t i) {
        const double e = x[i];
        acc += e * e;
      });
  const double total = detail::block_sum(acc, shared);
  detail::finish_sum(total, partials, counter, out, 1.0);
}

}  // namespace

void fill(DType dtype, void* data, std::int64_t n, double value, StreamHandle stream) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(value);
      std::uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      launch_fill<std::uint32_t>(data, n, bits, stream);
      break;
    }
    case DType::kBFloat16:
      // double → float → bf16 (RNE), as c10::BFloat16 does for a scalar.
      launch_fill<std::uint16_t>(data, n, bf16_bits_rne(static_cast<float>(value)), stream);
      break;
    case DType::kInt32:
      launch_fill<std::int32_t>(data, n, static_cast<std::int32_t>(value), stream);
      break;
    case DType::kInt64:
      launch_fill<std::int64_t>(data, n, static_cast<std::int64_t>(value), stream);
      break;
    default:
      throw InternalError(std::string("fill: no kernel for ") + dtype_name(dtype));
  }
}

void axpby(const float* x, float* y, std::int64_t n, float alpha, float beta, StreamHandle stream) {
  if (n <= 0) return;
  const bool vectorized = aligned16(x) && aligned16(y);
  detail::launch(axpby_kernel, blocks_by_four(n, vectorized), kThreads, 0, stream, x, y, n, alpha, beta, vectorized);
}

void scale(float* x, std::int64_t n, float alpha, StreamHandle stream) {
  if (n <= 0) return;
  const bool vectorized = aligned16(x);
  detail::launch(scale_kernel, blocks_by_four(n, vectorized), kThreads, 0, stream, x, n, alpha, vectorized);
}

void add(const float* a, const float* b, float* y, std::int64_t n, StreamHandle stream) {
  launch_binary(a, b, y, n, AddOp{}, stream);
}

void mul(const float* a, const float* b, float* y, std::int64_t n, bool accumulate, StreamHandle stream) {
  if (accumulate) {
    launch_binary(a, b, y, n, MulAccumulateOp{}, stream);
  } else {
    launch_binary(a, b, y, n, MulOp{}, stream);
  }
}

void cast(DType from, const void* src, DType to, void* dst, std::int64_t n, StreamHandle stream) {
  if (n <= 0) return;
  if (from == to) {
    const std::size_t bytes =
        from == DType::kBFloat16 ? 2 : (from == DType::kInt64 ? 8 : 4);
    if (src != dst)
      DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    const bool vectorized = aligned16(src) && (reinterpret_cast<std::uintptr_t>(dst) & 7u) == 0;
    detail::launch(f32_to_bf16_kernel, blocks_by_four(n, vectorized), kThreads, 0, stream,
                   static_cast<const float*>(src), static_cast<__nv_bfloat16*>(dst), n, vectorized);
    return;
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    detail::launch(bf16_to_f32_kernel, blocks_for(n), kThreads, 0, stream, static_cast<const __nv_bfloat16*>(src),
                   static_cast<float*>(dst), n);
    return;
  }
  throw InvalidArgument("cast: only float32 <-> bfloat16 conversions are supported");
}

void sum_squares(const float* x, std::int64_t n, double* out, StreamHandle stream) {
  double* partials = static_cast<double*>(reduction_scratch(stream));
  static_assert(kMaxPartials * sizeof(double) <= kReductionScratchBytes, "partials must fit the scratch");
  const bool vectorized = aligned16(x);
  std::int64_t blocks = n <= 0 ? 1 : ((vectorized ? (n + 3) / 4 : n) + kThreads - 1) / kThreads;
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  detail::launch(sum_squares_kernel, static_cast<unsigned int>(blocks), kThreads, 0, stream, x, n < 0 ? 0 : n, partials,
                 reduction_counters(stream), out, vectorized);
}

namespace {

// One work item per unit (FUnit, LUnit) of a row: consecutive threads copy consecutive pieces of one row, so both
// the reads (within a source row) and the writes are coalesced; the features' units first, then the labels'.
template <typename Unit>
__device__ __forceinline__ void gather_units(const Unit* __restrict__ src, std::int64_t units_per_row,
                                             const std::int64_t* rows, std::int64_t count, Unit* __restrict__ dst) {
  const std::int64_t total = count * units_per_row;
  for (std::int64_t k = thread_index(); k < total; k += grid_stride()) {
    const std::int64_t row = k / units_per_row;
    const std::int64_t col = k - row * units_per_row;
    dst[k] = src[rows[row] * units_per_row + col];
  }
}

// Every block reads the cursor before it counts itself in; the last block to arrive moves it on. A batch past
// the end is skipped by every block alike, so none of them counts.
template <typename FUnit, typename LUnit>
__global__ void gather_batch_kernel(const FUnit* __restrict__ features, std::int64_t feature_units,
                                    const LUnit* __restrict__ labels, std::int64_t label_units,
                                    const std::int64_t* __restrict__ indices, GatherCursor* cursor,
                                    std::int64_t count, FUnit* __restrict__ features_dst,
                                    LUnit* __restrict__ labels_dst) {
  detail::begin_kernel();
  const std::int64_t first = cursor != nullptr ? cursor->position : 0;
  if (cursor != nullptr && first + count > cursor->end) return;
  const std::int64_t* rows = indices + first;
  gather_units(features, feature_units, rows, count, features_dst);
  gather_units(labels, label_units, rows, count, labels_dst);
  if (cursor == nullptr) return;
  if (detail::arrived_last(&cursor->arrivals, gridDim.x) && threadIdx.x == 0) cursor->position = first + count;
}

// The widest access (16, 4 or 1 bytes) that every row start of `src` and `dst` allows.
std::int64_t unit_bytes(const void* src, std::int64_t row_bytes, const void* dst) {
  for (std::int64_t unit : {16, 4}) {
    if (row_bytes % unit == 0 && reinterpret_cast<std::uintptr_t>(src) % unit == 0 &&
        reinterpret_cast<std::uintptr_t>(dst) % unit == 0)
      return unit;
  }
  return 1;
}

template <typename FUnit, typename LUnit>
void launch_gather_batch(const void* features, std::int64_t feature_bytes, const void* labels,
                         std::int64_t label_bytes, const std::int64_t* indices, GatherCursor* cursor,
                         std::int64_t count, void* features_dst, void* labels_dst, cudaStream_t stream) {
  const std::int64_t feature_units = feature_bytes / static_cast<std::int64_t>(sizeof(FUnit));
  const std::int64_t label_units = label_bytes / static_cast<std::int64_t>(sizeof(LUnit));
  detail::launch(gather_batch_kernel<FUnit, LUnit>, blocks_for(count * std::max(feature_units, label_units)), kThreads,
                 0, stream, static_cast<const FUnit*>(features), feature_units, static_cast<const LUnit*>(labels),
                 label_units, indices, cursor, count, static_cast<FUnit*>(features_dst),
                 static_cast<LUnit*>(labels_dst));
}

template <typename FUnit>
void launch_gather_batch_for_labels(const void* features, std::int64_t feature_bytes, const void* labels,
                                    std::int64_t label_bytes, const std::int64_t* indices, GatherCursor* cursor,
                                    std::int64_t count, void* features_dst, void* labels_dst, cudaStream_t stream) {
  // Labels are int32 (4 bytes) in every data set so far; anything else goes byte by byte.
  if (unit_bytes(labels, label_bytes, labels_dst) >= 4) {
    launch_gather_batch<FUnit, std::uint32_t>(features, feature_bytes, labels, label_bytes, indices, cursor, count,
                                              features_dst, labels_dst, stream);
  } else {
    launch_gather_batch<FUnit, unsigned char>(features, feature_bytes, labels, label_bytes, indices, cursor, count,
                                              features_dst, labels_dst, stream);
  }
}

}  // namespace

namespace {

template <typename T>
__global__ void divide_kernel(T* x, std::int64_t n, std::int64_t divisor) {
  detail::begin_kernel();
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) / static_cast<float>(divisor));
    } else {
      x[i] = static_cast<T>(x[i] / divisor);
    }
  }
}

template <typename T>
void launch_divide(void* data, std::int64_t n, std::int64_t divisor, cudaStream_t stream) {
  detail::launch(divide_kernel<T>, blocks_for(n), kThreads, 0, stream, static_cast<T*>(data), n, divisor);
}

}  // namespace

void divide(DType dtype, void* data, std::int64_t n, std::int64_t divisor, StreamHandle stream) {
  if (n <= 0 || divisor == 1) return;
  switch (dtype) {
    case DType::kFloat32:  // the CPU's arithmetic: times the float reciprocal, formed on the host
      return scale(static_cast<float*>(data), n, 1.0f / static_cast<float>(divisor), stream);
    case DType::kBFloat16:
      return launch_divide<__nv_bfloat16>(data, n, divisor, stream);
    case DType::kInt32:
      return launch_divide<std::int32_t>(data, n, divisor, stream);
    case DType::kInt64:
      return launch_divide<std::int64_t>(data, n, divisor, stream);
    default:
      throw InternalError(std::string("divide: no kernel for ") + dtype_name(dtype));
  }
}

namespace {

// One thread per row, scanning its columns in order: the first bad column needs no atomics and no second pass,
// and the rows of a batch of samples are few and narrow.
__global__ void find_nonfinite_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                      std::int64_t* __restrict__ first_column) {
  detail::begin_kernel();
  for (std::int64_t r = thread_index(); r < rows; r += grid_stride()) {
    const float* row = x + r * cols;
    std::int64_t c = 0;
    while (c < cols && isfinite(row[c])) ++c;
    first_column[r] = c;
  }
}

// One thread per value of x then y; a value not finite offers its row-order key to the minimum. No __restrict__:
// the destination may be the source.
__global__ void copy_samples_checked_kernel(const float* const* sources, std::int64_t rows, std::int64_t a,
                                            std::int64_t b, std::int64_t ranks, std::int64_t rank, float* x_dst,
                                            float* y_dst, unsigned long long* first_bad) {
  detail::begin_kernel();
  const float* x = sources[0];
  const float* y = sources[1];
  const std::int64_t in_x = rows * a, total = in_x + rows * b;
  for (std::int64_t e = thread_index(); e < total; e += grid_stride()) {
    const bool is_x = e < in_x;
    const std::int64_t k = is_x ? e : e - in_x, width = is_x ? a : b;
    const float v = is_x ? x[k] : y[k];
    (is_x ? x_dst : y_dst)[k] = v;
    if (!isfinite(v)) {
      const std::int64_t r = k / width, c = k % width + (is_x ? 0 : a);
      atomicMin(first_bad, static_cast<unsigned long long>((r * (a + b) + c) * ranks + rank));
    }
  }
}

// One thread per value of the batch (x's then y's), each computing its row's draw.
__global__ void draw_samples_kernel(const float* __restrict__ x, const float* __restrict__ y, std::int64_t inputs,
                                    std::int64_t targets, std::uint64_t size, std::uint64_t key, std::int64_t batch,
                                    float* __restrict__ x_dst, float* __restrict__ y_dst) {
  detail::begin_kernel();
  const std::int64_t in_x = batch * inputs, total = in_x + batch * targets;
  for (std::int64_t e = thread_index(); e < total; e += grid_stride()) {
    const bool is_x = e < in_x;
    const std::int64_t k = is_x ? e : e - in_x, width = is_x ? inputs : targets;
    const std::int64_t i = k / width, c = k % width;
    const auto r = static_cast<std::int64_t>(counter_rng::splitmix64(key + static_cast<std::uint64_t>(i)) % size);
    if (is_x) {
      x_dst[k] = x[r * inputs + c];
    } else {
      y_dst[k] = y[r * targets + c];
    }
  }
}

}  // namespace

void draw_samples(const float* x, const float* y, std::int64_t inputs, std::int64_t targets, std::int64_t size,
                  std::uint64_t key, std::int64_t batch, float* x_dst, float* y_dst, StreamHandle stream) {
  if (batch <= 0) return;
  detail::launch(draw_samples_kernel, blocks_for(batch * (inputs + targets)), kThreads, 0, stream, x, y, inputs,
                 targets, static_cast<std::uint64_t>(size), key, batch, x_dst, y_dst);
}

void copy_samples_checked(const float* const* sources, std::int64_t rows, std::int64_t a, std::int64_t b,
                          std::int64_t ranks, std::int64_t rank, float* x_dst, float* y_dst, std::int64_t* first_bad,
                          StreamHandle stream) {
  if (rows <= 0) return;
  static_assert(kNoVeto > 0, "keys and kNoVeto compare as unsigned");
  detail::launch(copy_samples_checked_kernel, blocks_for(rows * (a + b)), kThreads, 0, stream, sources, rows, a, b,
                 ranks, rank, x_dst, y_dst, reinterpret_cast<unsigned long long*>(first_bad));
}

void find_nonfinite(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t* first_column,
                    StreamHandle stream) {
  if (rows <= 0) return;
  detail::launch(find_nonfinite_kernel, blocks_for(rows), kThreads, 0, stream, x, rows, cols, first_column);
}

void gather_batch(const void* features, std::int64_t feature_bytes, const void* labels, std::int64_t label_bytes,
                  const std::int64_t* indices, GatherCursor* cursor, std::int64_t count, void* features_dst,
                  void* labels_dst, StreamHandle stream) {
  if (count <= 0 || feature_bytes <= 0 || label_bytes <= 0) {
    DDP_CHECK(count <= 0, "gather_batch: rows of no bytes");
    return;
  }
  switch (unit_bytes(features, feature_bytes, features_dst)) {
    case 16:  // 784 float features
      return launch_gather_batch_for_labels<uint4>(features, feature_bytes, labels, label_bytes, indices, cursor,
                                                   count, features_dst, labels_dst, stream);
    case 4:
      return launch_gather_batch_for_labels<std::uint32_t>(features, feature_bytes, labels, label_bytes, indices,
                                                           cursor, count, features_dst, labels_dst, stream);
    default:
      return launch_gather_batch_for_labels<unsigned char>(features, feature_bytes, labels, label_bytes, indices,
                                                           cursor, count, features_dst, labels_dst, stream);
  }
}

}  // namespace ddp::kernels::cuda
