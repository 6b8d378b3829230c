// CPU kernels of the MLP-family layers (LayerNorm, frequency encoding, dropout, embedding, column copies): plain
// loops, in float32. They sit apart from elementwise.cc because each reduces or gathers along rows, and their
// CUDA twins (runtime/kernels/cuda/layers.cu) keep the same summation orders where the contract promises the
// CPU's bits (the embedding's gradient).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cpu/scratch.h"
#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cpu {

void layer_norm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows, std::int64_t cols,
                        float eps, float* y, float* mean, float* rstd, StreamHandle /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    // Two passes in double: the variance of the centred values does not cancel.
    double sum = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) sum += xr[c];
    const double m = sum / static_cast<double>(cols);
    double squares = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double d = xr[c] - m;
      squares += d * d;
    }
    const auto mf = static_cast<float>(m);
    const auto rs = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(cols) + eps));
    mean[r] = mf;
    rstd[r] = rs;
    float* yr = y + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      float v = (xr[c] - mf) * rs;
      if (weight != nullptr) v *= weight[c];
      if (bias != nullptr) v += bias[c];
      yr[c] = v;
    }
  }
}

void layer_norm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                         std::int64_t rows, std::int64_t cols, float* dx, bool accumulate_dx, float* dweight,
                         bool accumulate_dweight, float* dbias, bool accumulate_dbias, StreamHandle /*stream*/) {
  if (dx != nullptr) {
    const float inv_cols = 1.0f / static_cast<float>(cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* dyr = dy + r * cols;
      float* dxr = dx + r * cols;
      float sum_g = 0.0f, sum_gx = 0.0f;
      for (std::int64_t c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mean[r]) * rstd[r];
        const float g = weight != nullptr ? dyr[c] * weight[c] : dyr[c];
        sum_g += g;
        sum_gx += g * xhat;
      }
      const float mean_g = sum_g * inv_cols, mean_gx = sum_gx * inv_cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        const float xhat = (xr[c] - mean[r]) * rstd[r];
        const float g = weight != nullptr ? dyr[c] * weight[c] : dyr[c];
        const float v = rstd[r] * (g - mean_g - xhat * mean_gx);
        dxr[c] = accumulate_dx ? dxr[c] + v : v;
      }
    }
  }
  if (dweight == nullptr && dbias == nullptr) return;
  // Column sums in row order, in float (the GPU sums chunks of rows, then the chunks: another fixed order).
  float* sw = detail::scratch_floats(0, static_cast<std::size_t>(cols));
  float* sb = detail::scratch_floats(1, static_cast<std::size_t>(cols));
  std::memset(sw, 0, sizeof(float) * static_cast<std::size_t>(cols));
  std::memset(sb, 0, sizeof(float) * static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float product = dyr[c] * ((xr[c] - mean[r]) * rstd[r]);
      sw[c] += product;
      sb[c] += dyr[c];
    }
  }
  if (dweight != nullptr)
    for (std::int64_t c = 0; c < cols; ++c) dweight[c] = accumulate_dweight ? dweight[c] + sw[c] : sw[c];
  if (dbias != nullptr)
    for (std::int64_t c = 0; c < cols; ++c) dbias[c] = accumulate_dbias ? dbias[c] + sb[c] : sb[c];
}

namespace {

// a_k = float(2^k·π), formed in double: the one constant both devices and the PyTorch reference use.
float frequency(std::int64_t k) { return static_cast<float>(std::ldexp(3.14159265358979323846, static_cast<int>(k))); }

}  // namespace

void frequency_encoding_forward(const float* x, std::int64_t rows, std::int64_t in, std::int64_t frequencies,
                                bool include_input, float* y, StreamHandle /*stream*/) {
  const std::int64_t out = in * ((include_input ? 1 : 0) + 2 * frequencies);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    float* yr = y + r * out;
    if (include_input) {
      for (std::int64_t c = 0; c < in; ++c) yr[c] = xr[c];
      yr += in;
    }
    for (std::int64_t k = 0; k < frequencies; ++k) {
      const float a = frequency(k);
      for (std::int64_t c = 0; c < in; ++c) {
        const float arg = a * xr[c];
        yr[c] = std::sin(arg);
        yr[in + c] = std::cos(arg);
      }
      yr += 2 * in;
    }
  }
}

void frequency_encoding_backward(const float* x, const float* dy, std::int64_t rows, std::int64_t in,
                                 std::int64_t frequencies, bool include_input, float* dx, bool accumulate,
                                 StreamHandle /*stream*/) {
  const std::int64_t out = in * ((include_input ? 1 : 0) + 2 * frequencies);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < in; ++c) {
      const float v = x[r * in + c];
      const float* g = dy + r * out + c;
      float sum = include_input ? g[0] : 0.0f;
      if (include_input) g += in;
      for (std::int64_t k = 0; k < frequencies; ++k) {
        const float a = frequency(k);
        const float arg = a * v;
        const float term = g[0] * std::cos(arg) - g[in] * std::sin(arg);
        sum += a * term;
        g += 2 * in;
      }
      float& d = dx[r * in + c];
      d = accumulate ? d + sum : sum;
    }
  }
}

void dropout_forward(const float* x, std::int64_t n, float p, float scale, std::uint64_t seed,
                     const std::int64_t* draw, float* y, float* mask, StreamHandle /*stream*/) {
  const auto d = static_cast<std::uint64_t>(*draw);
  for (std::int64_t i = 0; i < n; ++i) {
    const float m = counter_rng::dropout_keeps(seed, d, static_cast<std::uint64_t>(i), p) ? scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

void advance_counter(std::int64_t* counter, std::int64_t by, StreamHandle /*stream*/) { *counter += by; }

void embedding_forward(const float* weight, std::int64_t num, std::int64_t dim, const std::int32_t* indices,
                       std::int64_t n, float* y, StreamHandle /*stream*/) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = indices[i];
    float* yi = y + i * dim;
    if (r < 0 || r >= num) {
      std::memset(yi, 0, sizeof(float) * static_cast<std::size_t>(dim));
    } else {
      std::memcpy(yi, weight + r * dim, sizeof(float) * static_cast<std::size_t>(dim));
    }
  }
}

void embedding_backward(const float* dy, const std::int32_t* indices, std::int64_t n, std::int64_t num,
                        std::int64_t dim, float* dweight, bool accumulate, StreamHandle /*stream*/) {
  // Each row's sum starts at 0 (or its old value) and adds the rows of dy in increasing i: the GPU's order.
  if (!accumulate) std::memset(dweight, 0, sizeof(float) * static_cast<std::size_t>(num * dim));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = indices[i];
    if (r < 0 || r >= num) continue;
    float* row = dweight + r * dim;
    const float* g = dy + i * dim;
    for (std::int64_t c = 0; c < dim; ++c) row[c] += g[c];
  }
}

void float_column_to_index(const float* x, std::int64_t rows, std::int64_t stride, std::int64_t column,
                           std::int64_t limit, std::int32_t* ids, StreamHandle /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float v = x[r * stride + column];
    // NaN fails every comparison, so it lands on −1 with the fractions and the out-of-range values.
    const bool valid = v >= 0.0f && v < static_cast<float>(limit) && std::floor(v) == v;
    ids[r] = valid ? static_cast<std::int32_t>(v) : -1;
  }
}

void copy_columns(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t rows,
                  std::int64_t cols, bool accumulate, StreamHandle /*stream*/) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * src_stride;
    float* d = dst + r * dst_stride;
    if (accumulate) {
      for (std::int64_t c = 0; c < cols; ++c) d[c] += s[c];
    } else {
      std::memcpy(d, s, sizeof(float) * static_cast<std::size_t>(cols));
    }
  }
}

}  // namespace ddp::kernels::cpu
