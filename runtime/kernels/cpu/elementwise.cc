// CPU elementwise kernels: standalone activations, fills, axpby/scale/add/mul, casts, reductions and row gathers. Plain loops over
// contiguous arrays, which -O3 vectorises.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/kernels/cpu/activation_math.h"
#include "runtime/core/bfloat16.h"
#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cpu {

// The activations are the costliest elementwise passes of a small MLP's step (tanh and sigmoid above all): each
// is built for AVX-512, for AVX2 and for the x86-64 baseline, and the loader picks by the CPU (GCC's
// target_clones). Without FMA contraction (-ffp-contract=off in BUILD) all three compute the same bits
// (tests/kernels/cpu/activation_math_test). Not in the sanitizer build: an ifunc resolver runs while the program
// is loaded, before the sanitizer's runtime has started.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DDP_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DDP_VECTOR_CLONES
#endif

DDP_VECTOR_CLONES
void activation_forward(Activation act, const float* x, float* y, std::int64_t n, StreamHandle /*stream*/) {
  switch (act) {
    case Activation::kNone:
      if (x != y)
        for (std::int64_t i = 0; i < n; ++i) y[i] = x[i];
      return;
    case Activation::kRelu:
      for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
      return;
    case Activation::kGelu:
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::gelu(x[i]);
      return;
    case Activation::kTanh:
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::tanh(x[i]);
      return;
    case Activation::kSigmoid:
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::sigmoid(x[i]);
      return;
    case Activation::kSilu:
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::silu(x[i]);
      return;
  }
}

DDP_VECTOR_CLONES
void activation_backward(Activation act, const float* x, const float* y, const float* dy, float* dx,
                         std::int64_t n, bool accumulate, StreamHandle /*stream*/) {
  switch (act) {
    case Activation::kNone:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += dy[i];
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i];
      }
      return;
    case Activation::kRelu:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
      }
      return;
    case Activation::kGelu:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += dy[i] * detail::gelu_grad(x[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::gelu_grad(x[i]);
      }
      return;
    case Activation::kTanh:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += dy[i] * detail::tanh_grad_from_output(y[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::tanh_grad_from_output(y[i]);
      }
      return;
    case Activation::kSigmoid:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += dy[i] * detail::sigmoid_grad_from_output(y[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::sigmoid_grad_from_output(y[i]);
      }
      return;
    case Activation::kSilu:
      if (accumulate) {
        for (std::int64_t i = 0; i < n; ++i) dx[i] += dy[i] * detail::silu_grad(x[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) dx[i] = dy[i] * detail::silu_grad(x[i]);
      }
      return;
  }
}

void fill(DType dtype, void* data, std::int64_t n, double value, StreamHandle /*stream*/) {
  switch (dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(data);
      const float v = static_cast<float>(value);
      for (std::int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      const std::uint16_t v = float_to_bf16(static_cast<float>(value));
      for (std::int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::kInt32: {
      auto* p = static_cast<std::int32_t*>(data);
      const auto v = static_cast<std::int32_t>(value);
      for (std::int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::kInt64: {
      auto* p = static_cast<std::int64_t*>(data);
      const auto v = static_cast<std::int64_t>(value);
      for (std::int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    default:
      throw InternalError(std::string("fill: no kernel for ") + dtype_name(dtype));
  }
}

void axpby(const float* x, float* y, std::int64_t n, float alpha, float beta, StreamHandle /*stream*/) {
  if (beta == 0.0f) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + beta * y[i];
  }
}

void scale(float* x, std::int64_t n, float alpha, StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

void add(const float* a, const float* b, float* y, std::int64_t n, StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, float* y, std::int64_t n, bool accumulate, StreamHandle /*stream*/) {
  if (accumulate) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float product = a[i] * b[i];
      y[i] += product;
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
  }
}

void cast(DType from, const void* src, DType to, void* dst, std::int64_t n, StreamHandle /*stream*/) {
  if (from == to) {
    const std::size_t bytes = static_cast<std::size_t>(n) * (from == DType::kBFloat16 ? 2 : 4);
    if (src != dst) std::memcpy(dst, src, bytes);
    return;
  }
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<std::uint16_t*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
    return;
  }
  if (from == DType::kBFloat16 && to == DType::kFloat32) {
    const auto* s = static_cast<const std::uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
    return;
  }
  throw InvalidArgument("cast: only float32 <-> bfloat16 conversions are supported");
}

void sum_squares(const float* x, std::int64_t n, double* out, StreamHandle /*stream*/) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  out[0] = sum;
}

void divide(DType dtype, void* data, std::int64_t n, std::int64_t divisor, StreamHandle /*stream*/) {
  if (divisor == 1) return;  // x / 1 == x in every type: no pass over the buffer at world size 1
  switch (dtype) {
    case DType::kFloat32: {
      auto* p = static_cast<float*>(data);
      const float inv = 1.0f / static_cast<float>(divisor);
      for (std::int64_t i = 0; i < n; ++i) p[i] *= inv;
      return;
    }
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(data);
      const auto d = static_cast<float>(divisor);
      for (std::int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / d);
      return;
    }
    case DType::kInt32: {
      auto* p = static_cast<std::int32_t*>(data);
      for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::int32_t>(p[i] / divisor);
      return;
    }
    case DType::kInt64: {
      auto* p = static_cast<std::int64_t*>(data);
      for (std::int64_t i = 0; i < n; ++i) p[i] /= divisor;
      return;
    }
    default:
      throw InternalError(std::string("divide: no kernel for ") + dtype_name(dtype));
  }
}

void find_nonfinite(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t* first_column,
                    StreamHandle /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    std::int64_t c = 0;
    while (c < cols && std::isfinite(row[c])) ++c;
    first_column[r] = c;
  }
}

void copy_samples_checked(const float* const* sources, std::int64_t rows, std::int64_t a, std::int64_t b,
                          std::int64_t ranks, std::int64_t rank, float* x_dst, float* y_dst, std::int64_t* first_bad,
                          StreamHandle /*stream*/) {
  const float* x = sources[0];
  const float* y = sources[1];
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < a + b; ++c) {
      const float v = c < a ? x[r * a + c] : y[r * b + c - a];
      (c < a ? x_dst[r * a + c] : y_dst[r * b + c - a]) = v;
      if (!std::isfinite(v)) *first_bad = std::min(*first_bad, (r * (a + b) + c) * ranks + rank);
    }
  }
}

void draw_samples(const float* x, const float* y, std::int64_t inputs, std::int64_t targets, std::int64_t size,
                  std::uint64_t key, std::int64_t batch, float* x_dst, float* y_dst, StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < batch; ++i) {
    const auto r = static_cast<std::int64_t>(counter_rng::splitmix64(key + static_cast<std::uint64_t>(i)) %
                                             static_cast<std::uint64_t>(size));
    std::memcpy(x_dst + i * inputs, x + r * inputs, static_cast<std::size_t>(inputs) * sizeof(float));
    std::memcpy(y_dst + i * targets, y + r * targets, static_cast<std::size_t>(targets) * sizeof(float));
  }
}

void gather_batch(const void* features, std::int64_t feature_bytes, const void* labels, std::int64_t label_bytes,
                  const std::int64_t* indices, GatherCursor* cursor, std::int64_t count, void* features_dst,
                  void* labels_dst, StreamHandle /*stream*/) {
  const std::int64_t first = cursor != nullptr ? cursor->position : 0;
  if (cursor != nullptr && first + count > cursor->end) return;
  const std::int64_t* rows = indices + first;
  auto gather = [&](const void* src, std::int64_t row_bytes, void* dst) {
    const auto* from = static_cast<const unsigned char*>(src);
    auto* to = static_cast<unsigned char*>(dst);
    for (std::int64_t i = 0; i < count; ++i) std::memcpy(to + i * row_bytes, from + rows[i] * row_bytes, row_bytes);
  };
  gather(features, feature_bytes, features_dst);
  gather(labels, label_bytes, labels_dst);
  if (cursor != nullptr) cursor->position += count;
}

}  // namespace ddp::kernels::cpu
