// The fused optimizer updates over flat float32 buffers: one kernel reads param, grad and state once and writes
// param and state once (torch.optim's foreach/fused paths do the same work in several passes).
//
// The formulas are PyTorch's, term by term (torch.optim.SGD and torch.optim.AdamW, amsgrad off, not maximize),
// so a run here and a run in PyTorch follow each other to float rounding. Step-dependent scalars (AdamW's bias
// corrections) are computed on the host in double, as PyTorch does for a non-capturable step (runtime/kernels/kernels.h:
// adamw_scalars, shared with the CPU), and reach the kernel as arguments or, for a CUDA graph, through device
// memory written before each replay.
#include <cmath>

#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

// The optional bfloat16 copy of the updated parameters: four values as one 8-byte store, or one.
__device__ __forceinline__ void store_bf16x4(void* copy, std::int64_t v, const float4& p) {
  if (copy == nullptr) return;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(p.z, p.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const unsigned int*>(&lo);
  packed.y = *reinterpret_cast<const unsigned int*>(&hi);
  reinterpret_cast<uint2*>(copy)[v] = packed;
}
__device__ __forceinline__ void store_bf16(void* copy, std::int64_t i, float p) {
  if (copy != nullptr) static_cast<__nv_bfloat16*>(copy)[i] = __float2bfloat16_rn(p);
}

__device__ __forceinline__ float sgd_one(float p, float g, float* buf, const SgdScalars& s) {
  if (s.weight_decay != 0.0f) g = g + s.weight_decay * p;  // d_p = d_p.add(param, alpha=weight_decay)
  if (s.use_momentum) {
    const float b = s.first_step ? g : s.momentum * *buf + s.one_minus_dampening * g;
    *buf = b;
    g = s.nesterov ? g + s.momentum * b : b;
  }
  return p - s.lr * g;
}

// Every array is read and written at the same index only, so no __restrict__ is needed for correctness.
__global__ void sgd_kernel(float* param, const float* grad, float* buf, std::int64_t n, SgdScalars from_host,
                           const SgdScalars* from_device, void* copy, bool vectorized) {
  detail::begin_kernel();
  const SgdScalars s = from_device != nullptr ? *from_device : from_host;
  if (s.skip) return;
  const bool read_buf = s.use_momentum && !s.first_step;
  detail::for_each_by_four(
      n, vectorized,
      [&](std::int64_t v) {
        float4* p4 = reinterpret_cast<float4*>(param);
        float4* b4 = reinterpret_cast<float4*>(buf);
        float4 p = p4[v];
        const float4 g = reinterpret_cast<const float4*>(grad)[v];
        float4 b = read_buf ? b4[v] : make_float4(0.f, 0.f, 0.f, 0.f);
        p.x = sgd_one(p.x, g.x, &b.x, s);
        p.y = sgd_one(p.y, g.y, &b.y, s);
        p.z = sgd_one(p.z, g.z, &b.z, s);
        p.w = sgd_one(p.w, g.w, &b.w, s);
        p4[v] = p;
        if (s.use_momentum) b4[v] = b;
        store_bf16x4(copy, v, p);
      },
      [&](std::int64_t i) {
        float b = read_buf ? buf[i] : 0.0f;
        const float p = sgd_one(param[i], grad[i], &b, s);
        param[i] = p;
        if (s.use_momentum) buf[i] = b;
        store_bf16(copy, i, p);
      });
}

__device__ __forceinline__ float adamw_one(float p, float g, float* m, float* v, const AdamWScalars& s) {
  p = p * s.decay;
  const float m_new = s.beta1 * *m + s.one_minus_beta1 * g;
  const float v_new = s.beta2 * *v + s.one_minus_beta2 * g * g;
  *m = m_new;
  *v = v_new;
  const float denom = sqrtf(v_new) / s.bias_c2_sqrt + s.eps;
  return p - s.step_size * (m_new / denom);
}

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                             AdamWScalars from_host, const AdamWScalars* from_device, void* copy, bool vectorized) {
  detail::begin_kernel();
  const AdamWScalars s = from_device != nullptr ? *from_device : from_host;
  if (s.skip) return;
  detail::for_each_by_four(
      n, vectorized,
      [&](std::int64_t i) {
        float4* p4 = reinterpret_cast<float4*>(param);
        float4* m4 = reinterpret_cast<float4*>(exp_avg);
        float4* v4 = reinterpret_cast<float4*>(exp_avg_sq);
        float4 p = p4[i];
        const float4 g = reinterpret_cast<const float4*>(grad)[i];
        float4 m = m4[i];
        float4 v = v4[i];
        p.x = adamw_one(p.x, g.x, &m.x, &v.x, s);
        p.y = adamw_one(p.y, g.y, &m.y, &v.y, s);
        p.z = adamw_one(p.z, g.z, &m.z, &v.z, s);
        p.w = adamw_one(p.w, g.w, &m.w, &v.w, s);
        p4[i] = p;
        m4[i] = m;
        v4[i] = v;
        store_bf16x4(copy, i, p);
      },
      [&](std::int64_t i) {
        float m = exp_avg[i];
        float v = exp_avg_sq[i];
        const float p = adamw_one(param[i], grad[i], &m, &v, s);
        param[i] = p;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        store_bf16(copy, i, p);
      });
}

// The bf16 copy is written four elements (8 bytes) at a time in the vectorized loop.
bool aligned8(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 7u) == 0; }

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdParams& p,
              void* param_bf16, StreamHandle stream) {
  if (n <= 0) return;
  // The momentum flag decides the buffer's alignment check; it is a hyperparameter, not a per-step value, so the
  // host's copy is right also when the kernel reads device_scalars.
  const SgdScalars s = sgd_scalars(p);
  DDP_CHECK(!s.use_momentum || momentum_buffer != nullptr, "sgd_step: momentum != 0 needs a momentum buffer");
  const bool vectorized = detail::aligned16(param) && detail::aligned16(grad) &&
                          (!s.use_momentum || detail::aligned16(momentum_buffer)) && aligned8(param_bf16);
  detail::launch(sgd_kernel, detail::blocks_by_four(n, vectorized), detail::kThreads, 0, stream, param, grad,
                 momentum_buffer, n, s, p.device_scalars, param_bf16, vectorized);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWParams& p, void* param_bf16, StreamHandle stream) {
  if (n <= 0) return;
  AdamWScalars s{};
  if (p.device_scalars == nullptr) {
    DDP_CHECK(p.step >= 1, "adamw_step: step is 1-based (the count after this update)");
    s = adamw_scalars(p);
  }
  const bool vectorized = detail::aligned16(param) && detail::aligned16(grad) && detail::aligned16(exp_avg) &&
                          detail::aligned16(exp_avg_sq) && aligned8(param_bf16);
  detail::launch(adamw_kernel, detail::blocks_by_four(n, vectorized), detail::kThreads, 0, stream, param, grad, exp_avg,
                 exp_avg_sq, n, s, p.device_scalars, param_bf16, vectorized);
}

namespace {

template <typename Scalars>
__global__ void write_scalars_kernel(Scalars value, Scalars* destination) {
  detail::begin_kernel();
  *destination = value;
}

// One block: every thread reads the index before thread 0 moves it on (or, vetoed, marks the row skipped).
__global__ void take_next_row_kernel(const unsigned char* __restrict__ table, std::int64_t row_bytes,
                                     std::int64_t* index, unsigned char* __restrict__ dst, std::int64_t* veto,
                                     std::int64_t* report) {
  detail::begin_kernel();
  const std::int64_t row = *index;
  for (std::int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) dst[b] = table[row * row_bytes + b];
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (veto == nullptr || *veto == kNoVeto) {
    *index = row + 1;
    return;
  }
  *reinterpret_cast<std::int32_t*>(dst) = 1;
  // `report` is host memory the host reads after the stream: written through, never cached.
  volatile std::int64_t* to_host = report;
  if (to_host[1] == 0) to_host[0] = *veto;
  to_host[1] = to_host[1] + 1;
  *veto = kNoVeto;
}

}  // namespace

void write_sgd_scalars(const SgdParams& p, SgdScalars* device_scalars, StreamHandle stream) {
  detail::launch(write_scalars_kernel<SgdScalars>, 1, 1, 0, stream, sgd_scalars(p), device_scalars);
}

void write_adamw_scalars(const AdamWParams& p, AdamWScalars* device_scalars, StreamHandle stream) {
  DDP_CHECK(p.step >= 1, "write_adamw_scalars: step is 1-based (the count after this update)");
  detail::launch(write_scalars_kernel<AdamWScalars>, 1, 1, 0, stream, adamw_scalars(p), device_scalars);
}

void take_next_row(const void* table, std::int64_t row_bytes, std::int64_t* index, void* dst, std::int64_t* veto,
                   std::int64_t* report, StreamHandle stream) {
  DDP_CHECK(veto == nullptr || report != nullptr, "take_next_row: a veto needs a report");
  detail::launch(take_next_row_kernel, 1, 64, 0, stream, static_cast<const unsigned char*>(table), row_bytes, index,
                 static_cast<unsigned char*>(dst), veto, report);
}

}  // namespace ddp::kernels::cuda
