// The raw kernel interface every op is built on: one function per computation, over device pointers, taking
// the device's stream explicitly. Each function has two implementations with the same contract:
// ops/cpu/*.cc (OpenBLAS + loops; `stream` is ignored, the work is done on return) and ops/cuda/*.cu
// (cuBLAS/cuBLASLt + kernels, enqueued on `stream`, no host synchronisation, no allocation in steady state).
// The tensor-level ops (ops/*.h) dispatch here on the tensor's device and record their backward on the tape.
//
// Layout conventions: row-major; a Linear weight is [out, in] (PyTorch's layout), so y = x · Wᵀ + b.
// Every `accumulate` flag means "add into the output" (gradient accumulation) instead of overwriting it.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace ddp::kernels {

using StreamHandle = CUstream_st*;  // nullptr on the CPU

enum class ScalarType : std::uint8_t { kFloat32, kBFloat16, kInt32, kInt64 };

// GELU is the exact (erf) form, as torch.nn.GELU() by default.
enum class Activation : std::uint8_t { kNone, kRelu, kGelu };

// Matmul precision for float32 inputs on the GPU: exact FP32, or TF32 tensor cores. bf16 inputs always
// accumulate in FP32. Ignored on the CPU.
enum class MathMode : std::uint8_t { kFloat32, kTF32 };

struct LinearShape {
  std::int64_t batch;  // rows of x
  std::int64_t in;     // features in
  std::int64_t out;    // features out
};

// ---- Linear (GEMM with fused epilogue) ----
// y[batch,out] = act(x[batch,in] · w[out,in]ᵀ + bias[out]). `bias` may be null. x, w, y share `dtype`
// (float32 or bfloat16); bias has the same dtype. For kGelu, `pre_activation` [batch,out] (same dtype)
// receives x·wᵀ+b, which the backward needs; for kRelu/kNone it may be null (ReLU's backward uses y).
void linear_forward(ScalarType dtype, MathMode math, const LinearShape& shape, const void* x, const void* w,
                    const void* bias, Activation act, void* y, void* pre_activation, StreamHandle stream);

// Given dy[batch,out] (the gradient w.r.t. the linear's *activated* output y), computes
//   dz = dy ⊙ act'(·)      (act' from y for kRelu, from pre_activation for kGelu, 1 for kNone)
//   dx[batch,in]  = dz · w          (skipped when dx is null; always overwritten)
//   dw[out,in]   (+)= dzᵀ · x       (accumulate into dw when `accumulate`)
//   dbias[out]   (+)= Σ_rows dz     (skipped when dbias is null; accumulate likewise)
// `scratch_dz` [batch,out] holds dz when act != kNone (null allowed for kNone). dtype as in the forward.
void linear_backward(ScalarType dtype, MathMode math, const LinearShape& shape, const void* dy, const void* x,
                     const void* w, const void* y, const void* pre_activation, Activation act, void* dx, void* dw,
                     void* dbias, bool accumulate, void* scratch_dz, StreamHandle stream);

// ---- Elementwise activations (standalone, float32) ----
void activation_forward(Activation act, const float* x, float* y, std::int64_t n, StreamHandle stream);
// dx = dy ⊙ act'(x); `x` is the activation's input. `accumulate` adds into dx.
void activation_backward(Activation act, const float* x, const float* dy, float* dx, std::int64_t n,
                         bool accumulate, StreamHandle stream);

// ---- Losses (float32 logits) ----
// Numerically stable softmax cross-entropy, mean over the batch. labels are int32 class indices in [0, classes).
// Writes the mean loss to loss[0] (device memory) and, when dlogits is non-null, the gradient of the mean loss
// w.r.t. the logits, (softmax − onehot) / batch, into dlogits[batch,classes] (overwritten).
void softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::int64_t batch,
                           std::int64_t classes, float* loss, float* dlogits, StreamHandle stream);

// Mean squared error, mean over all n elements: loss[0] = Σ (pred − target)² / n; dpred (optional) = 2(pred − target)/n.
void mse_loss(const float* pred, const float* target, std::int64_t n, float* loss, float* dpred,
              StreamHandle stream);

// correct[0] = number of rows whose argmax over `classes` equals labels[row] (int64, device memory).
// Ties go to the lowest index, as torch.argmax.
void count_correct(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                   std::int64_t* correct, StreamHandle stream);
// out[row] = argmax over the row (int32).
void argmax_rows(const float* logits, std::int64_t batch, std::int64_t classes, std::int32_t* out,
                 StreamHandle stream);

// ---- Elementwise utilities ----
void fill(ScalarType dtype, void* data, std::int64_t n, double value, StreamHandle stream);
// y = alpha * x + beta * y (float32). beta == 0 overwrites y without reading it.
void axpby(const float* x, float* y, std::int64_t n, float alpha, float beta, StreamHandle stream);
// Scales in place: x *= alpha (float32).
void scale(float* x, std::int64_t n, float alpha, StreamHandle stream);
// Type conversion between float32 and bfloat16 (round to nearest even), either direction.
void cast(ScalarType from, const void* src, ScalarType to, void* dst, std::int64_t n, StreamHandle stream);
// Sum of squares of x, accumulated in double precision, written to out[0] (double, device memory).
void sum_squares(const float* x, std::int64_t n, double* out, StreamHandle stream);
// Writes 1 to flag[0] (int32, device memory) if any element of x is NaN or infinite, else leaves it alone.
void flag_nonfinite(const float* x, std::int64_t n, std::int32_t* flag, StreamHandle stream);

// ---- Random numbers: identical on CPU and GPU for the same (seed, offset) ----
// Element i gets a value from a counter-based generator keyed by (seed, offset + i), so the result does not
// depend on the device, the launch shape or the thread count.
void uniform(float* data, std::int64_t n, float low, float high, std::uint64_t seed, std::uint64_t offset,
             StreamHandle stream);
void normal(float* data, std::int64_t n, float mean, float stddev, std::uint64_t seed, std::uint64_t offset,
            StreamHandle stream);

// ---- Optimizers over flat float32 buffers (one fused pass) ----
struct SgdParams {
  float lr;
  float momentum;      // 0 disables the buffer
  float dampening;     // PyTorch's dampening (0 by default)
  float weight_decay;  // L2, added to the gradient as in torch.optim.SGD
  bool nesterov;
  bool first_step;     // PyTorch initialises the momentum buffer to the gradient on the first step
};
// param -= lr * update, with PyTorch's torch.optim.SGD rules. `momentum_buffer` may be null if momentum == 0.
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdParams& p,
              StreamHandle stream);

struct AdamWParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;  // decoupled: param *= 1 − lr·wd before the Adam update
  std::int64_t step;   // 1-based step count after this update, for bias correction
};
// torch.optim.AdamW's update (amsgrad off, not maximize).
void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                const AdamWParams& p, StreamHandle stream);

}  // namespace ddp::kernels
