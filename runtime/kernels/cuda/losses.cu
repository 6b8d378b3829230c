// Losses and accuracy: softmax cross-entropy (float32 or bfloat16 logits), MSE, count_correct, argmax_rows
// (float32).
//
// One warp owns a row (classes are few, rows many), so a row's max, log-sum-exp and gradient need only shuffles.
// Scalar results are deterministic: each block writes a partial for a fixed set of rows (the grid depends only on
// the problem size), and the block that finishes last adds the partials in index order (detail::arrived_last), in
// the same launch. No float atomics anywhere, so the same inputs give the same loss bits on every run and every
// rank.
#include <cmath>
#include <limits>

#include "runtime/kernels/cuda/blas_handle.h"
#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

using detail::kThreads;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kMaxPartials = 1024;
static_assert(kMaxPartials * sizeof(double) <= kReductionScratchBytes, "partials must fit the scratch");

unsigned int row_blocks(std::int64_t rows) {
  std::int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  return static_cast<unsigned int>(blocks);
}

__global__ void write_float_kernel(float* out, float value) {
  detail::begin_kernel();
  out[0] = value;
}

// Per row: loss_r = log Σ exp(x − max) − (x[label] − max); dlogits = (softmax − onehot) · inv_batch, stored in
// the logits' type. Three passes over the row (max, sum, gradient), each reading eight elements per lane per step
// with 16-byte loads when the row allows it (`vec`): the later passes find the row in cache, so the kernel moves
// about one read and one write of the logits.
template <typename T>
__global__ void softmax_xent_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ labels,
                                    std::int64_t batch, std::int64_t classes, T* __restrict__ dlogits,
                                    float inv_batch, double* __restrict__ partials, unsigned int* counter,
                                    float* __restrict__ loss, bool vec) {
  detail::begin_kernel();
  __shared__ double warp_losses[kWarpsPerBlock];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  double my_loss = 0.0;  // meaningful in lane 0: this warp's rows, in row order
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < batch;
       row += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* x = logits + row * classes;
    float m = -INFINITY;
    if (vec) {
      for (std::int64_t c = lane * 8; c < classes; c += 256) {
        float v[8];
        detail::load8(x + c, v);
        for (int j = 0; j < 8; ++j) m = fmaxf(m, v[j]);
      }
    } else {
      for (std::int64_t c = lane; c < classes; c += 32) m = fmaxf(m, detail::to_float(x[c]));
    }
    m = detail::warp_max(m);
    float s = 0.0f;
    if (vec) {
      for (std::int64_t c = lane * 8; c < classes; c += 256) {
        float v[8];
        detail::load8(x + c, v);
        for (int j = 0; j < 8; ++j) s += expf(v[j] - m);
      }
    } else {
      for (std::int64_t c = lane; c < classes; c += 32) s += expf(detail::to_float(x[c]) - m);
    }
    s = detail::warp_sum(s);
    const std::int32_t label = labels[row];
    const bool label_ok = label >= 0 && label < classes;
    if (dlogits != nullptr) {
      const float inv_s = 1.0f / s;
      T* g = dlogits + row * classes;
      if (vec) {
        for (std::int64_t c = lane * 8; c < classes; c += 256) {
          float v[8];
          detail::load8(x + c, v);
          for (int j = 0; j < 8; ++j) v[j] = (expf(v[j] - m) * inv_s - (c + j == label ? 1.0f : 0.0f)) * inv_batch;
          detail::store8(g + c, v);
        }
      } else {
        for (std::int64_t c = lane; c < classes; c += 32) {
          const float p = expf(detail::to_float(x[c]) - m) * inv_s;
          g[c] = detail::from_float<T>((p - (c == label ? 1.0f : 0.0f)) * inv_batch);
        }
      }
    }
    if (lane == 0) {
      // An out-of-range label is a caller bug; make it visible as a NaN loss instead of reading out of bounds.
      const float row_loss = label_ok ? logf(s) - (detail::to_float(x[label]) - m) : NAN;
      my_loss += static_cast<double>(row_loss);
    }
  }
  if (lane == 0) warp_losses[warp] = my_loss;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_losses[w];
  detail::finish_sum(total, partials, counter, loss, 1.0 / static_cast<double>(batch));
}

__global__ void mse_kernel(const float* __restrict__ pred, const float* __restrict__ target, std::int64_t n,
                           float* __restrict__ dpred, float grad_scale, double* __restrict__ partials,
                           unsigned int* counter, float* __restrict__ loss) {
  detail::begin_kernel();
  __shared__ double shared[32];
  double acc = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float d = pred[i] - target[i];
    acc += static_cast<double>(d) * d;
    if (dpred != nullptr) dpred[i] = grad_scale * d;
  }
  const double total = detail::block_sum(acc, shared);
  detail::finish_sum(total, partials, counter, loss, 1.0 / static_cast<double>(n));
}

// Greater value wins; NaN beats numbers (torch.argmax treats NaN as the maximum); ties go to the lower index.
__device__ __forceinline__ bool better(float v, std::int64_t i, float best, std::int64_t best_i) {
  const bool v_nan = v != v;
  const bool b_nan = best != best;
  if (v_nan != b_nan) return v_nan;
  if (!v_nan && v != best) return v > best;
  return i < best_i;
}

// Argmax of a row by one warp; the result is valid in every lane.
__device__ __forceinline__ std::int64_t warp_argmax(const float* x, std::int64_t classes, int lane) {
  float best = -INFINITY;
  std::int64_t best_i = classes;  // sentinel: loses every tie against a real index
  for (std::int64_t c = lane; c < classes; c += 32) {
    const float v = x[c];
    if (best_i == classes || better(v, c, best, best_i)) {
      best = v;
      best_i = c;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, offset);
    const std::int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (oi != classes && (best_i == classes || better(ov, oi, best, best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  return best_i == classes ? -1 : best_i;  // -1 only for a row with no classes
}

__global__ void count_correct_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ labels,
                                     std::int64_t batch, std::int64_t classes, long long* __restrict__ partials,
                                     unsigned int* counter, std::int64_t* __restrict__ correct) {
  detail::begin_kernel();
  __shared__ long long warp_counts[kWarpsPerBlock];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  long long count = 0;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < batch;
       row += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    const std::int64_t best = warp_argmax(logits + row * classes, classes, lane);
    if (best == static_cast<std::int64_t>(labels[row])) ++count;
  }
  if (lane == 0) warp_counts[warp] = count;
  __syncthreads();
  long long total = 0;
  for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_counts[w];
  detail::finish_sum(total, partials, counter, correct, 1.0);
}

__global__ void argmax_rows_kernel(const float* __restrict__ logits, std::int64_t batch, std::int64_t classes,
                                   std::int32_t* __restrict__ out) {
  detail::begin_kernel();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < batch;
       row += static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock) {
    const std::int64_t best = warp_argmax(logits + row * classes, classes, lane);
    if (lane == 0) out[row] = static_cast<std::int32_t>(best);
  }
}

}  // namespace

void softmax_cross_entropy(DType dtype, const void* logits, const std::int32_t* labels, std::int64_t batch,
                           std::int64_t classes, float* loss, void* dlogits, StreamHandle stream) {
  DDP_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
            "softmax_cross_entropy: logits must be float32 or bfloat16");
  if (batch <= 0 || classes <= 0) {
    // The mean over no rows is NaN, as torch's; no gradient elements to write.
    detail::launch(write_float_kernel, 1, 1, 0, stream, loss, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  double* partials = static_cast<double*>(reduction_scratch(stream));
  unsigned int* counter = reduction_counters(stream);
  const unsigned int blocks = row_blocks(batch);
  const bool vec = classes % 8 == 0 && detail::aligned16(logits) && (dlogits == nullptr || detail::aligned16(dlogits));
  const float inv_batch = static_cast<float>(1.0 / static_cast<double>(batch));
  if (dtype == DType::kFloat32) {
    detail::launch(softmax_xent_kernel<float>, blocks, kThreads, 0, stream, static_cast<const float*>(logits), labels,
                   batch, classes, static_cast<float*>(dlogits), inv_batch, partials, counter, loss, vec);
  } else {
    detail::launch(softmax_xent_kernel<__nv_bfloat16>, blocks, kThreads, 0, stream,
                   static_cast<const __nv_bfloat16*>(logits), labels, batch, classes,
                   static_cast<__nv_bfloat16*>(dlogits), inv_batch, partials, counter, loss, vec);
  }
}

void mse_loss(const float* pred, const float* target, std::int64_t n, float* loss, float* dpred,
              StreamHandle stream) {
  if (n <= 0) {
    detail::launch(write_float_kernel, 1, 1, 0, stream, loss, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  double* partials = static_cast<double*>(reduction_scratch(stream));
  std::int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  detail::launch(mse_kernel, static_cast<unsigned int>(blocks), kThreads, 0, stream, pred, target, n, dpred,
                 static_cast<float>(2.0 / static_cast<double>(n)), partials, reduction_counters(stream), loss);
}

void count_correct(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                   std::int64_t* correct, StreamHandle stream) {
  long long* partials = static_cast<long long*>(reduction_scratch(stream));
  const unsigned int blocks = row_blocks(batch);
  detail::launch(count_correct_kernel, blocks, kThreads, 0, stream, logits, labels, batch < 0 ? 0 : batch, classes,
                 partials, reduction_counters(stream), correct);
}

void argmax_rows(const float* logits, std::int64_t batch, std::int64_t classes, std::int32_t* out,
                 StreamHandle stream) {
  if (batch <= 0) return;
  detail::launch(argmax_rows_kernel, row_blocks(batch), kThreads, 0, stream, logits, batch, classes, out);
}

}  // namespace ddp::kernels::cuda
