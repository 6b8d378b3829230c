// The narrow Linear of narrow_linear.h: a layer of at most kNarrowMaxOut outputs, forward and backward in one
// launch each. Every sum runs in a fixed order that depends on the shape alone (no atomics), so the results are
// the same bits on every run, eager or graphed.
//
// Both kernels are short and their time is memory latency: each is written so that the loads a thread needs
// are issued together (fixed-count loops, guarded loads, no break), so that a kernel waits about once per
// chunk of work rather than once per load, and so that the arithmetic reads registers, not shared memory.
#include "runtime/kernels/cuda/narrow_linear.h"

#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda::detail {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;  // forward: one row per warp at a time
// The forward stages the weights in shared memory, kWeightFloats at a time (kMaxOut rows of a column chunk).
constexpr int kWeightFloats = 8192;
// Backward: a block owns kColumns input columns; its kRowLanes rows of threads share the rows of each chunk.
constexpr int kColumns = 32;
constexpr int kRowLanes = 8;
constexpr int kChunkRows = 64;
constexpr int kRowsPerLane = kChunkRows / kRowLanes;
// Each backward block walks every row; past this many cuBLASLt's GEMMs, which split the rows, are faster.
constexpr std::int64_t kMaxBackwardRows = 1024;

// A block of 8 warps takes 8 rows (one per warp) and walks `in` in chunks of kWeightFloats / kMaxOut columns:
// each lane loads its elements of the row's chunk (every 32nd), the block stages the weights' chunk in shared
// memory (all outputs), and each lane accumulates its elements' products for every output; then one butterfly
// reduction per output, and lane o finishes output o.
template <typename TIn, typename TOut, int kMaxOut>
__global__ void __launch_bounds__(kThreads)
    narrow_forward_kernel(const TIn* __restrict__ x, const TIn* __restrict__ w, const TOut* __restrict__ bias,
                          Activation act, TOut* __restrict__ y, TOut* __restrict__ pre, std::int64_t batch,
                          std::int64_t in, int out) {
  detail::begin_kernel();
  constexpr int kChunk = kWeightFloats / kMaxOut;  // columns per chunk
  constexpr int kPerLane = kChunk / 32;
  __shared__ float w_s[kMaxOut][kChunk];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock; row0 < batch;
       row0 += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    const std::int64_t row = row0 + warp;
    const bool row_ok = row < batch;
    float acc[kMaxOut];
#pragma unroll
    for (int o = 0; o < kMaxOut; ++o) acc[o] = 0.0f;
    for (std::int64_t c0 = 0; c0 < in; c0 += kChunk) {
      float xv[kPerLane];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const std::int64_t i = c0 + lane + 32 * k;
        xv[k] = row_ok && i < in ? to_float(x[row * in + i]) : 0.0f;
      }
      __syncthreads();  // the previous chunk's weights are no longer read
#pragma unroll
      for (int e = threadIdx.x; e < kMaxOut * kChunk; e += kThreads) {
        const int o = e / kChunk, i = e % kChunk;
        w_s[o][i] = o < out && c0 + i < in ? to_float(w[o * in + c0 + i]) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
#pragma unroll
        for (int o = 0; o < kMaxOut; ++o) acc[o] = fmaf(xv[k], w_s[o][lane + 32 * k], acc[o]);
      }
    }
    float z = 0.0f;
#pragma unroll
    for (int o = 0; o < kMaxOut; ++o) {
      const float sum = warp_sum(acc[o]);
      if (lane == o) z = sum;
    }
    if (row_ok && lane < out) {
      if (bias != nullptr) z += to_float(bias[lane]);
      // As bias_activation: a bfloat16 pre-activation is stored rounded and the activation taken of the stored
      // value, so the backward differentiates the function the forward applied.
      const TOut z_stored = from_float<TOut>(z);
      if (pre != nullptr) pre[row * out + lane] = z_stored;
      y[row * out + lane] = from_float<TOut>(apply_activation(act, to_float(z_stored)));
    }
  }
}

// Block (kColumns, kRowLanes) owns input columns [c0, c0 + kColumns) and walks the rows in chunks of kChunkRows.
// The chunk's dz (dy with the activation's derivative, all outputs; contiguous in [batch, out]) is staged in
// shared memory by coalesced loads; thread (tx, ty) then takes rows ty, ty + kRowLanes, ... of the chunk, with
// its column of x and of w in registers, and for each row reads the row's dz (the same for the whole warp) and
//   dx[r, c] = Σ_o dz[r, o]·w[o, c],   dw[o, c] += dz[r, o]·x[r, c] (a partial per thread row),
// and in block 0, lane 0 also sums dbias's partials. The next chunk's loads are issued before this chunk's
// products. At the end the kRowLanes partials of dw (and dbias) are added in row-lane order.
template <typename TIn, typename TOut, typename TGrad, int kMaxOut>
__global__ void __launch_bounds__(kColumns* kRowLanes)
    narrow_backward_kernel(const TOut* __restrict__ dy, const TOut* __restrict__ saved, Activation act,
                           const TIn* __restrict__ x, const TIn* __restrict__ w, TIn* __restrict__ dx,
                           TGrad* __restrict__ dw, TGrad* __restrict__ dbias, bool accumulate,
                           TIn* __restrict__ scratch_dz, std::int64_t batch, std::int64_t in, int out) {
  detail::begin_kernel();
  constexpr int kThreadsPerBlock = kColumns * kRowLanes;
  constexpr int kDzPerThread = kChunkRows * kMaxOut / kThreadsPerBlock;
  constexpr int kStride = kMaxOut + 4;  // rows of dz_s stay 16-byte aligned
  __shared__ __align__(16) float dz_s[kChunkRows][kStride];
  __shared__ float partial_s[kRowLanes][kMaxOut][kColumns];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int t = ty * kColumns + tx;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kColumns + tx;
  const bool col_ok = col < in;
  const bool first_block = blockIdx.x == 0;
  const bool sums_bias = dbias != nullptr && first_block && tx == 0;
  const int chunk_capacity = kChunkRows * out;
  // Outputs past `out` stay zero in dz_s for the whole kernel (the chunks write only o < out), so the sums over
  // kMaxOut outputs below need no test; the loop's first barrier orders these stores before any read.
  for (int e = t; e < kChunkRows * kStride; e += kThreadsPerBlock) {
    if (e % kStride >= out) dz_s[e / kStride][e % kStride] = 0.0f;
  }
  float w_r[kMaxOut];
#pragma unroll
  for (int o = 0; o < kMaxOut; ++o) w_r[o] = o < out && col_ok ? to_float(w[o * in + col]) : 0.0f;

  // Elements of dy in the chunk of rows from r0 (fewer than kChunkRows·out in the last one).
  auto chunk_elements = [&](std::int64_t r0) { return (batch - r0 < kChunkRows ? batch - r0 : kChunkRows) * out; };
  float dy_r[kDzPerThread], saved_r[kDzPerThread], x_r[kRowsPerLane];
  auto load_chunk = [&](std::int64_t r0) {
    const std::int64_t elements = chunk_elements(r0);
#pragma unroll
    for (int k = 0; k < kDzPerThread; ++k) {
      const int e = t + k * kThreadsPerBlock;
      const bool ok = e < elements;
      dy_r[k] = ok ? to_float(dy[r0 * out + e]) : 0.0f;
      saved_r[k] = ok && act != Activation::kNone ? to_float(saved[r0 * out + e]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      const std::int64_t r = r0 + ty + j * kRowLanes;
      x_r[j] = r < batch && col_ok ? to_float(x[r * in + col]) : 0.0f;
    }
  };

  float dw_acc[kMaxOut], db_acc[kMaxOut];
#pragma unroll
  for (int o = 0; o < kMaxOut; ++o) dw_acc[o] = db_acc[o] = 0.0f;
  load_chunk(0);
  for (std::int64_t r0 = 0; r0 < batch; r0 += kChunkRows) {
    const std::int64_t elements = chunk_elements(r0);
#pragma unroll
    for (int k = 0; k < kDzPerThread; ++k) {
      const int e = t + k * kThreadsPerBlock;
      if (e < chunk_capacity) {  // rows past the batch get zeros: they add nothing below
        float g = dy_r[k];
        if (act != Activation::kNone) g *= activation_grad(act, saved_r[k]);
        if (scratch_dz != nullptr && first_block && e < elements) scratch_dz[r0 * out + e] = from_float<TIn>(g);
        dz_s[e / out][e % out] = g;
      }
    }
    float xv[kRowsPerLane];
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) xv[j] = x_r[j];
    __syncthreads();
    if (r0 + kChunkRows < batch) load_chunk(r0 + kChunkRows);  // in flight during the products below
#pragma unroll
    for (int j = 0; j < kRowsPerLane; ++j) {
      const int b = ty + j * kRowLanes;
      float g[kMaxOut];
#pragma unroll
      for (int o = 0; o < kMaxOut; o += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&dz_s[b][o]);
        g[o] = v.x, g[o + 1] = v.y, g[o + 2] = v.z, g[o + 3] = v.w;
      }
      float s = 0.0f;
#pragma unroll
      for (int o = 0; o < kMaxOut; ++o) {
        dw_acc[o] = fmaf(g[o], xv[j], dw_acc[o]);
        s = fmaf(g[o], w_r[o], s);
      }
      if (dx != nullptr && col_ok && r0 + b < batch) dx[(r0 + b) * in + col] = from_float<TIn>(s);
      if (sums_bias) {
#pragma unroll
        for (int o = 0; o < kMaxOut; ++o) db_acc[o] += g[o];
      }
    }
    __syncthreads();  // the next chunk overwrites dz_s
  }

  // dw: the row lanes' partials, added in row-lane order by the thread of (column, output).
#pragma unroll
  for (int o = 0; o < kMaxOut; ++o) partial_s[ty][o][tx] = dw_acc[o];
  __syncthreads();
  if (dw != nullptr && col_ok) {
    for (int o = ty; o < out; o += kRowLanes) {
      float sum = 0.0f;
#pragma unroll
      for (int y = 0; y < kRowLanes; ++y) sum += partial_s[y][o][tx];
      TGrad* g = dw + o * in + col;
      *g = from_float<TGrad>(accumulate ? to_float(*g) + sum : sum);
    }
  }
  if (dbias == nullptr || !first_block) return;
  __syncthreads();
  if (tx == 0) {
#pragma unroll
    for (int o = 0; o < kMaxOut; ++o) partial_s[ty][o][0] = db_acc[o];
  }
  __syncthreads();
  if (ty == 0 && tx < out) {
    float sum = 0.0f;
#pragma unroll
    for (int y = 0; y < kRowLanes; ++y) sum += partial_s[y][tx][0];
    dbias[tx] = from_float<TGrad>(accumulate ? to_float(dbias[tx]) + sum : sum);
  }
}

// Calls f(TIn{}, TOut{}, TGrad{}) with the C++ types of `types` (linear.cu's check_types has vetted them).
template <typename F>
void with_types(const LinearTypes& types, F&& f) {
  using bf16 = __nv_bfloat16;
  if (types.input == DType::kFloat32) return f(float{}, float{}, float{});
  if (types.output == DType::kBFloat16) {
    if (types.grad == DType::kBFloat16) return f(bf16{}, bf16{}, bf16{});
    return f(bf16{}, bf16{}, float{});
  }
  if (types.grad == DType::kBFloat16) return f(bf16{}, float{}, bf16{});
  f(bf16{}, float{}, float{});
}

}  // namespace

bool narrow_forward_fits(const LinearShape& shape) {
  return shape.out > 0 && shape.out <= kNarrowMaxOut && shape.in > 0 && shape.batch > 0;
}

bool narrow_backward_fits(const LinearShape& shape) {
  return narrow_forward_fits(shape) && shape.batch <= kMaxBackwardRows;
}

void narrow_linear_forward(LinearTypes types, const LinearShape& shape, const void* x, const void* w,
                           const void* bias, Activation act, void* y, void* pre_activation, cudaStream_t stream) {
  DDP_ASSERT(narrow_forward_fits(shape), "narrow_linear_forward: shape out of range");
  const unsigned int blocks = blocks_for(shape.batch, kWarpsPerBlock);  // a row per warp, at most kMaxBlocks
  const int out = static_cast<int>(shape.out);
  with_types(types, [&](auto in_tag, auto out_tag, auto) {
    using TIn = decltype(in_tag);
    using TOut = decltype(out_tag);
    auto run = [&](auto kernel) {
      launch(kernel, blocks, kThreads, 0, stream, static_cast<const TIn*>(x), static_cast<const TIn*>(w),
             static_cast<const TOut*>(bias), act, static_cast<TOut*>(y), static_cast<TOut*>(pre_activation),
             shape.batch, shape.in, out);
    };
    out <= 16 ? run(narrow_forward_kernel<TIn, TOut, 16>) : run(narrow_forward_kernel<TIn, TOut, 32>);
  });
}

void narrow_linear_backward(LinearTypes types, const LinearShape& shape, const void* dy, const void* saved,
                            Activation act, const void* x, const void* w, void* dx, void* dw, void* dbias,
                            bool accumulate, void* scratch_dz, cudaStream_t stream) {
  DDP_ASSERT(narrow_backward_fits(shape), "narrow_linear_backward: shape out of range");
  DDP_ASSERT(act == Activation::kNone || saved != nullptr, "narrow_linear_backward: the activation needs `saved`");
  const std::int64_t blocks = (shape.in + kColumns - 1) / kColumns;
  const int out = static_cast<int>(shape.out);
  with_types(types, [&](auto in_tag, auto out_tag, auto grad_tag) {
    using TIn = decltype(in_tag);
    using TOut = decltype(out_tag);
    using TGrad = decltype(grad_tag);
    auto run = [&](auto kernel) {
      launch(kernel, static_cast<unsigned int>(blocks), dim3(kColumns, kRowLanes), 0, stream,
             static_cast<const TOut*>(dy), static_cast<const TOut*>(saved), act, static_cast<const TIn*>(x),
             static_cast<const TIn*>(w), static_cast<TIn*>(dx), static_cast<TGrad*>(dw), static_cast<TGrad*>(dbias),
             accumulate, static_cast<TIn*>(scratch_dz), shape.batch, shape.in, out);
    };
    out <= 16 ? run(narrow_backward_kernel<TIn, TOut, TGrad, 16>) : run(narrow_backward_kernel<TIn, TOut, TGrad, 32>);
  });
}

}  // namespace ddp::kernels::cuda::detail
