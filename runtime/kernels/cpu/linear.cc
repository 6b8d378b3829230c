// CPU linear forward/backward: OpenBLAS sgemm plus the epilogue loops. bf16 tensors are widened to float in
// per-thread scratch (no steady-state allocation), computed in float and rounded back once.
#include <cblas.h>

#include <cstdint>
#include <string>

#include "runtime/kernels/cpu/activation_math.h"
#include "runtime/core/bfloat16.h"
#include "runtime/kernels/cpu/scratch.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cpu {
namespace {

void check_shape(const char* op, const LinearShape& s) {
  DDP_CHECK(s.batch >= 0 && s.in > 0 && s.out > 0,
            std::string(op) + ": bad shape batch=" + std::to_string(s.batch) + " in=" + std::to_string(s.in) +
                " out=" + std::to_string(s.out));
}

void check_dtype(const char* op, DType dtype) {
  DDP_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
            std::string(op) + ": only float32 and bfloat16 are supported");
}

// Widens `n` values of `dtype` at `src` to float; float32 input is returned as is (no copy).
const float* widen(DType dtype, const void* src, std::int64_t n, int slot) {
  if (src == nullptr) return nullptr;
  if (dtype == DType::kFloat32) return static_cast<const float*>(src);
  float* dst = detail::scratch_floats(slot, static_cast<std::size_t>(n));
  const auto* h = static_cast<const std::uint16_t*>(src);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(h[i]);
  return dst;
}

void narrow(const float* src, std::int64_t n, std::uint16_t* dst) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void check_types(const char* op, const LinearTypes& t) {
  check_dtype(op, t.input);
  check_dtype(op, t.output);
  check_dtype(op, t.grad);
  DDP_CHECK(t.input == DType::kBFloat16 || (t.output == t.input && t.grad == t.input),
            std::string(op) + ": float32 input needs float32 output and gradients (mixed types are for bfloat16 "
                              "input only)");
}

// Where to compute an output of `dtype` in float: the output itself when it is float32, else scratch `slot`,
// holding the output's current values when `with_values` (an output that is accumulated into or updated).
float* output_floats(DType dtype, void* out, std::int64_t n, int slot, bool with_values = false) {
  if (dtype == DType::kFloat32) return static_cast<float*>(out);
  float* f = detail::scratch_floats(slot, static_cast<std::size_t>(n));
  if (with_values) {
    const auto* h = static_cast<const std::uint16_t*>(out);
    for (std::int64_t i = 0; i < n; ++i) f[i] = bf16_to_float(h[i]);
  }
  return f;
}

// Each value rounded to bfloat16 and back: what a bfloat16 buffer will hold.
void round_to_bf16(float* v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) v[i] = bf16_to_float(float_to_bf16(v[i]));
}

// out[c] (+)= Σ_r m[r, c], the rows added in order. The sums of a block of columns stay in local variables
// over all the rows: added into `out` row by row, each add would wait for the store before it.
template <std::int64_t kWidth>
void add_column_block(const float* m, std::int64_t rows, std::int64_t cols, bool accumulate, float* out) {
  float sum[kWidth];
  for (std::int64_t c = 0; c < kWidth; ++c) sum[c] = accumulate ? out[c] : 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (std::int64_t c = 0; c < kWidth; ++c) sum[c] += row[c];
  }
  for (std::int64_t c = 0; c < kWidth; ++c) out[c] = sum[c];
}

void add_column_sums(const float* m, std::int64_t rows, std::int64_t cols, bool accumulate, float* out) {
  constexpr std::int64_t kBlock = 32;  // eight SSE registers of sums
  std::int64_t c = 0;
  for (; c + kBlock <= cols; c += kBlock) add_column_block<kBlock>(m + c, rows, cols, accumulate, out + c);
  for (; c < cols; ++c) add_column_block<1>(m + c, rows, cols, accumulate, out + c);
}

// Stores a float result computed by output_floats() into `out` (a no-op when it was computed in place).
void store(DType dtype, const float* src, std::int64_t n, void* out) {
  if (dtype == DType::kFloat32) return;
  narrow(src, n, static_cast<std::uint16_t*>(out));
}

// y = act(x·wᵀ + b) in float; pre (optional) receives x·wᵀ + b.
void linear_forward_f32(const LinearShape& s, const float* x, const float* w, const float* bias, Activation act,
                        float* y, float* pre) {
  const std::int64_t B = s.batch, I = s.in, O = s.out;
  if (B == 0) return;
  float* z = pre != nullptr ? pre : y;
  if (bias != nullptr) {
    for (std::int64_t r = 0; r < B; ++r) {
      float* row = z + r * O;
      for (std::int64_t c = 0; c < O; ++c) row[c] = bias[c];
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(B), static_cast<int>(O),
              static_cast<int>(I), 1.0f, x, static_cast<int>(I), w, static_cast<int>(I),
              bias != nullptr ? 1.0f : 0.0f, z, static_cast<int>(O));
  const std::int64_t n = B * O;
  switch (act) {
    case Activation::kNone:
      if (z != y)
        for (std::int64_t i = 0; i < n; ++i) y[i] = z[i];
      break;
    case Activation::kRelu:
      for (std::int64_t i = 0; i < n; ++i) y[i] = z[i] > 0.0f ? z[i] : 0.0f;
      break;
    case Activation::kGelu:
      for (std::int64_t i = 0; i < n; ++i) y[i] = detail::gelu(z[i]);
      break;
    default:
      DDP_ASSERT(false, "linear_forward: a fused activation is kNone, kRelu or kGelu");
  }
}

// dz = dy ⊙ act'; returns dz (dy itself for kNone).
const float* activation_grad(Activation act, std::int64_t n, const float* dy, const float* y, const float* pre,
                             float* dz) {
  switch (act) {
    case Activation::kNone:
      return dy;
    case Activation::kRelu:
      DDP_ASSERT(y != nullptr, "linear_backward: ReLU needs the forward output y");
      for (std::int64_t i = 0; i < n; ++i) dz[i] = y[i] > 0.0f ? dy[i] : 0.0f;
      return dz;
    case Activation::kGelu:
      DDP_ASSERT(pre != nullptr, "linear_backward: GELU needs pre_activation");
      for (std::int64_t i = 0; i < n; ++i) dz[i] = dy[i] * detail::gelu_grad(pre[i]);
      return dz;
    default:
      DDP_ASSERT(false, "linear_backward: a fused activation is kNone, kRelu or kGelu");
  }
  return dy;
}

void linear_backward_f32(const LinearShape& s, const float* dz, const float* x, const float* w, float* dx,
                         float* dw, float* dbias, bool accumulate) {
  const std::int64_t B = s.batch, I = s.in, O = s.out;
  if (dx != nullptr && B > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(B), static_cast<int>(I),
                static_cast<int>(O), 1.0f, dz, static_cast<int>(O), w, static_cast<int>(I), 0.0f, dx,
                static_cast<int>(I));
  }
  if (dw != nullptr) {
    if (B > 0) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(O), static_cast<int>(I),
                  static_cast<int>(B), 1.0f, dz, static_cast<int>(O), x, static_cast<int>(I),
                  accumulate ? 1.0f : 0.0f, dw, static_cast<int>(I));
    } else if (!accumulate) {
      for (std::int64_t i = 0; i < O * I; ++i) dw[i] = 0.0f;
    }
  }
  if (dbias != nullptr) add_column_sums(dz, B, O, accumulate, dbias);
}

}  // namespace

void linear_forward(LinearTypes types, MathMode /*math*/, const LinearShape& shape, const void* x, const void* w,
                    const void* bias, Activation act, void* y, void* pre_activation, StreamHandle /*stream*/) {
  check_shape("linear_forward", shape);
  check_types("linear_forward", types);
  const std::int64_t B = shape.batch, I = shape.in, O = shape.out;
  if (types.input == DType::kFloat32) {
    linear_forward_f32(shape, static_cast<const float*>(x), static_cast<const float*>(w),
                       static_cast<const float*>(bias), act, static_cast<float*>(y),
                       static_cast<float*>(pre_activation));
    return;
  }
  // bf16 input: widen, compute in float, store each output once in its own type.
  const float* xf = widen(types.input, x, B * I, 0);
  const float* wf = widen(types.input, w, O * I, 1);
  const float* bf = widen(types.output, bias, O, 2);
  float* yf = output_floats(types.output, y, B * O, 3);
  float* pf = pre_activation != nullptr ? output_floats(types.output, pre_activation, B * O, 4) : nullptr;
  linear_forward_f32(shape, xf, wf, bf, act, yf, pf);
  store(types.output, yf, B * O, y);
  if (pf != nullptr) store(types.output, pf, B * O, pre_activation);
}

void linear_backward(LinearTypes types, MathMode /*math*/, const LinearShape& shape, const void* dy, const void* x,
                     const void* w, const void* y, const void* pre_activation, Activation act, void* dx, void* dw,
                     void* dbias, bool accumulate, void* scratch_dz, StreamHandle /*stream*/) {
  check_shape("linear_backward", shape);
  check_types("linear_backward", types);
  const std::int64_t B = shape.batch, I = shape.in, O = shape.out;
  if (types.input == DType::kFloat32) {
    DDP_ASSERT(act == Activation::kNone || scratch_dz != nullptr, "linear_backward: scratch_dz is required");
    const float* dz = activation_grad(act, B * O, static_cast<const float*>(dy), static_cast<const float*>(y),
                                      static_cast<const float*>(pre_activation), static_cast<float*>(scratch_dz));
    linear_backward_f32(shape, dz, static_cast<const float*>(x), static_cast<const float*>(w),
                        static_cast<float*>(dx), static_cast<float*>(dw), static_cast<float*>(dbias), accumulate);
    return;
  }
  // bf16 input: widen everything, compute in float, round each output once to its type (accumulation happens
  // in float). dz is rounded to bf16 before the products, as the GPU's GEMMs read it.
  const float* dyf = widen(types.output, dy, B * O, 0);
  const float* xf = widen(types.input, x, B * I, 1);
  const float* wf = widen(types.input, w, O * I, 2);
  const float* yf = act == Activation::kRelu ? widen(types.output, y, B * O, 3) : nullptr;
  const float* pf = act == Activation::kGelu ? widen(types.output, pre_activation, B * O, 3) : nullptr;
  float* dzf = detail::scratch_floats(4, static_cast<std::size_t>(B * O));
  const float* dz = activation_grad(act, B * O, dyf, yf, pf, dzf);
  if (dz != dzf)
    for (std::int64_t i = 0; i < B * O; ++i) dzf[i] = dz[i];
  round_to_bf16(dzf, B * O);
  if (scratch_dz != nullptr) narrow(dzf, B * O, static_cast<std::uint16_t*>(scratch_dz));
  float* dxf = dx != nullptr ? detail::scratch_floats(5, static_cast<std::size_t>(B * I)) : nullptr;
  float* dwf = dw != nullptr ? output_floats(types.grad, dw, O * I, 6, accumulate) : nullptr;
  float* dbf = dbias != nullptr ? output_floats(types.grad, dbias, O, 7, accumulate) : nullptr;
  linear_backward_f32(shape, dzf, xf, wf, dxf, dwf, dbf, accumulate);
  if (dxf != nullptr) narrow(dxf, B * I, static_cast<std::uint16_t*>(dx));
  if (dwf != nullptr) store(types.grad, dwf, O * I, dw);
  if (dbf != nullptr) store(types.grad, dbf, O, dbias);
}

}  // namespace ddp::kernels::cpu
