// CPU optimizer steps over flat float32 buffers: one pass per step, the update rules of torch.optim.SGD and
// torch.optim.AdamW written out per element.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/core/bfloat16.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cpu {
namespace {

// The optional bfloat16 copy of the updated parameters (see kernel_functions.inc).
void write_bf16_copy(const float* param, std::int64_t n, void* param_bf16) {
  if (param_bf16 == nullptr) return;
  auto* out = static_cast<std::uint16_t*>(param_bf16);
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(param[i]);
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdParams& p,
              void* param_bf16, StreamHandle /*stream*/) {
  const SgdScalars s = p.device_scalars != nullptr ? *p.device_scalars : sgd_scalars(p);
  if (s.skip) return;
  const float lr = s.lr, wd = s.weight_decay, mu = s.momentum, keep = s.one_minus_dampening;
  if (!s.use_momentum) {
    for (std::int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
    write_bf16_copy(param, n, param_bf16);
    return;
  }
  DDP_CHECK(momentum_buffer != nullptr, "sgd_step: momentum != 0 needs a momentum buffer");
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    // PyTorch: the first step initialises the buffer to the gradient itself (no dampening).
    const float buf = s.first_step ? g : mu * momentum_buffer[i] + keep * g;
    momentum_buffer[i] = buf;
    const float update = s.nesterov ? g + mu * buf : buf;
    param[i] -= lr * update;
  }
  write_bf16_copy(param, n, param_bf16);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWParams& p, void* param_bf16, StreamHandle /*stream*/) {
  if (p.device_scalars == nullptr) DDP_CHECK(p.step >= 1, "adamw_step: step is 1-based, got " + std::to_string(p.step));
  const AdamWScalars s = p.device_scalars != nullptr ? *p.device_scalars : adamw_scalars(p);
  if (s.skip) return;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = s.beta1 * exp_avg[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * exp_avg_sq[i] + s.one_minus_beta2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / s.bias_c2_sqrt + s.eps;
    param[i] = param[i] * s.decay - s.step_size * (m / denom);
  }
  write_bf16_copy(param, n, param_bf16);
}

void write_sgd_scalars(const SgdParams& p, SgdScalars* device_scalars, StreamHandle /*stream*/) {
  *device_scalars = sgd_scalars(p);
}

void write_adamw_scalars(const AdamWParams& p, AdamWScalars* device_scalars, StreamHandle /*stream*/) {
  DDP_CHECK(p.step >= 1, "write_adamw_scalars: step is 1-based, got " + std::to_string(p.step));
  *device_scalars = adamw_scalars(p);
}

void take_next_row(const void* table, std::int64_t row_bytes, std::int64_t* index, void* dst, std::int64_t* veto,
                   std::int64_t* report, StreamHandle /*stream*/) {
  std::memcpy(dst, static_cast<const unsigned char*>(table) + *index * row_bytes, static_cast<std::size_t>(row_bytes));
  if (veto == nullptr || *veto == kNoVeto) {
    ++*index;
    return;
  }
  *static_cast<std::int32_t*>(dst) = 1;
  if (report[1] == 0) report[0] = *veto;
  ++report[1];
  *veto = kNoVeto;
}

}  // namespace ddp::kernels::cpu
