// CPU losses and metrics: numerically stable softmax cross-entropy (row max subtracted, sums in double; float32 or
// bfloat16 logits),
// mean squared error, argmax with ties to the lowest index.
#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/core/bfloat16.h"
#include "runtime/kernels/cpu/scratch.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cpu {
namespace {

void check_label(const char* op, std::int32_t label, std::int64_t row, std::int64_t classes) {
  if (label < 0 || label >= classes) {
    throw InvalidArgument(std::string(op) + ": label " + std::to_string(label) + " at row " + std::to_string(row) +
                          " is outside [0, " + std::to_string(classes) + ")");
  }
}

std::int32_t row_argmax(const float* row, std::int64_t classes) {
  std::int32_t best = 0;
  float best_value = row[0];
  for (std::int64_t c = 1; c < classes; ++c) {
    // NaN compares false, as in a strict '>' scan; ties keep the lower index.
    if (row[c] > best_value) {
      best_value = row[c];
      best = static_cast<std::int32_t>(c);
    }
  }
  return best;
}

}  // namespace

void softmax_cross_entropy(DType dtype, const void* logits_in, const std::int32_t* labels, std::int64_t batch,
                           std::int64_t classes, float* loss, void* dlogits_out, StreamHandle /*stream*/) {
  DDP_CHECK(batch > 0 && classes > 0, "softmax_cross_entropy: empty logits [" + std::to_string(batch) + ", " +
                                          std::to_string(classes) + "]");
  DDP_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
            "softmax_cross_entropy: logits must be float32 or bfloat16");
  const bool bf16 = dtype == DType::kBFloat16;
  const std::int64_t n = batch * classes;
  // bfloat16 logits are widened into scratch and the gradient computed there, then rounded once.
  const float* logits = static_cast<const float*>(logits_in);
  if (bf16) {
    float* wide = detail::scratch_floats(0, static_cast<std::size_t>(n));
    const auto* h = static_cast<const std::uint16_t*>(logits_in);
    for (std::int64_t i = 0; i < n; ++i) wide[i] = bf16_to_float(h[i]);
    logits = wide;
  }
  float* dlogits = dlogits_out == nullptr ? nullptr
                   : bf16               ? detail::scratch_floats(1, static_cast<std::size_t>(n))
                                        : static_cast<float*>(dlogits_out);
  double total = 0.0;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (std::int64_t r = 0; r < batch; ++r) {
    const float* row = logits + r * classes;
    const std::int32_t label = labels[r];
    check_label("softmax_cross_entropy", label, r, classes);
    float m = row[0];
    for (std::int64_t c = 1; c < classes; ++c) m = row[c] > m ? row[c] : m;
    double sum = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - m));
    const double log_sum = std::log(sum);
    total += log_sum - static_cast<double>(row[label] - m);
    if (dlogits != nullptr) {
      float* drow = dlogits + r * classes;
      const double inv_sum = 1.0 / sum;
      for (std::int64_t c = 0; c < classes; ++c) {
        const float p = static_cast<float>(std::exp(static_cast<double>(row[c] - m)) * inv_sum);
        drow[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_batch;
      }
    }
  }
  loss[0] = static_cast<float>(total / static_cast<double>(batch));
  if (bf16 && dlogits != nullptr) {
    auto* out = static_cast<std::uint16_t*>(dlogits_out);
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(dlogits[i]);
  }
}

void mse_loss(const float* pred, const float* target, std::int64_t n, float* loss, float* dpred,
              StreamHandle /*stream*/) {
  DDP_CHECK(n > 0, "mse_loss: no elements");
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    total += d * d;
  }
  loss[0] = static_cast<float>(total / static_cast<double>(n));
  if (dpred != nullptr) {
    const float k = 2.0f / static_cast<float>(n);
    for (std::int64_t i = 0; i < n; ++i) dpred[i] = k * (pred[i] - target[i]);
  }
}

void count_correct(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                   std::int64_t* correct, StreamHandle /*stream*/) {
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < batch; ++r) n += row_argmax(logits + r * classes, classes) == labels[r] ? 1 : 0;
  correct[0] = n;
}

void argmax_rows(const float* logits, std::int64_t batch, std::int64_t classes, std::int32_t* out,
                 StreamHandle /*stream*/) {
  for (std::int64_t r = 0; r < batch; ++r) out[r] = row_argmax(logits + r * classes, classes);
}

}  // namespace ddp::kernels::cpu
