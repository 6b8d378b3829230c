// CPU optimizer steps over flat float32 buffers: one pass per step, the update rules of torch.optim.SGD and
// torch.optim.AdamW written out per element.
#include <cmath>
#include <cstdint>
#include <string>

#include "ops/cpu/bfloat16.h"
#include "ops/kernels.h"
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
  // Constants are derived in double (the hyperparameters' type, as in PyTorch) and rounded once.
  const float lr = static_cast<float>(p.lr), wd = static_cast<float>(p.weight_decay);
  const float mu = static_cast<float>(p.momentum), keep = static_cast<float>(1.0 - p.dampening);
  if (mu == 0.0f) {
    for (std::int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
    write_bf16_copy(param, n, param_bf16);
    return;
  }
  DDP_CHECK(momentum_buffer != nullptr, "sgd_step: momentum != 0 needs a momentum buffer");
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + wd * param[i];
    // PyTorch: the first step initialises the buffer to the gradient itself (no dampening).
    const float buf = p.first_step ? g : mu * momentum_buffer[i] + keep * g;
    momentum_buffer[i] = buf;
    const float update = p.nesterov ? g + mu * buf : buf;
    param[i] -= lr * update;
  }
  write_bf16_copy(param, n, param_bf16);
}

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWParams& p, void* param_bf16, StreamHandle /*stream*/) {
  DDP_CHECK(p.step >= 1, "adamw_step: step is 1-based, got " + std::to_string(p.step));
  const double t = static_cast<double>(p.step);
  // Constants are derived in double (the hyperparameters' type, as in PyTorch) and rounded once, exactly as
  // ops/cuda/optimizers.cu does, so both devices compute the same update.
  const double bias_correction1 = 1.0 - std::pow(p.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(p.beta2, t);
  const float step_size = static_cast<float>(p.lr / bias_correction1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bias_correction2));
  const float decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  const float b1 = static_cast<float>(p.beta1), b2 = static_cast<float>(p.beta2), eps = static_cast<float>(p.eps);
  const float one_minus_b1 = static_cast<float>(1.0 - p.beta1), one_minus_b2 = static_cast<float>(1.0 - p.beta2);
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = b1 * exp_avg[i] + one_minus_b1 * g;
    const float v = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / sqrt_bc2 + eps;
    param[i] = param[i] * decay - step_size * (m / denom);
  }
  write_bf16_copy(param, n, param_bf16);
}

}  // namespace ddp::kernels::cpu
