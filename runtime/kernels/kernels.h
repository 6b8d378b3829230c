// The raw kernel interface every op is built on: one function per computation, over device pointers, taking
// the device's stream explicitly. Each function has two implementations with the same contract:
// runtime/kernels/cpu/*.cc (OpenBLAS + loops; `stream` is ignored, the work is done on return) and runtime/kernels/cuda/*.cu
// (cuBLAS/cuBLASLt + kernels, enqueued on `stream`, no host synchronisation, no allocation in steady state).
// The one list of functions is runtime/kernels/kernel_functions.inc, declared here twice: in ddp::kernels::cpu and in
// ddp::kernels::cuda, so both implementations link into one binary and a test can compare them.
// The tensor-level ops (runtime/ops/*.h) dispatch here on the tensor's device and record their backward on the tape.
//
// Layout conventions: row-major; a Linear weight is [out, in] (PyTorch's layout), so y = x · Wᵀ + b.
// Every `accumulate` flag means "add into the output" (gradient accumulation) instead of overwriting it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/core/activation.h"  // Activation (public; the kernels take it)
#include "runtime/core/dtype.h"
#include "runtime/core/math_mode.h"   // MathMode (public; likewise)
#include "runtime/core/stream.h"  // StreamHandle

namespace ddp::kernels {

using StreamHandle = CUstream_st*;  // nullptr on the CPU
using ddp::Activation;
using ddp::MathMode;

// Element types of one Linear call. `input` is x's and w's (and dz's and dx's in the backward). `output` is y's,
// the bias's and pre_activation's (so dy's and the saved activation's); `grad` is dw's and dbias's. All three
// are `input` unless mixed precision asks otherwise: with bfloat16 input, `output` may be float32 (logits for
// a float32 loss straight from the GEMM) and `grad` may be float32 (the FP32 master weights' gradient slots,
// written by the GEMM with no bfloat16 weight gradient in between). Implicit from one type, so the uniform
// case reads `linear_forward(DType::kFloat32, ...)`.
struct LinearTypes {
  DType input, output, grad;
  LinearTypes(DType all) : input(all), output(all), grad(all) {}  // NOLINT(runtime/explicit): see above
  LinearTypes(DType in, DType out, DType g) : input(in), output(out), grad(g) {}
};

struct LinearShape {
  std::int64_t batch;  // rows of x
  std::int64_t in;     // features in
  std::int64_t out;    // features out
};

// The values a fused step kernel uses. The hyperparameters are double, as PyTorch's (Python floats): derived
// constants such as 1 − β₂ are formed in double and rounded to float once (sgd_scalars / adamw_scalars below,
// shared by both implementations), so the update matches torch.optim to float rounding and the CPU and the GPU
// compute the same one.
// `skip` comes first in both, at the same offset: a step vetoed on the device (take_next_row) sets it and the
// update then leaves the parameters and the state as they were.
struct SgdScalars {
  std::int32_t skip;
  float lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step, use_momentum;
};
struct AdamWScalars {
  std::int32_t skip;
  float decay;  // 1 − lr·wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;     // lr / (1 − β1^t)
  float bias_c2_sqrt;  // sqrt(1 − β2^t)
  float eps;
};

// A plain MLP's whole training pass in two launches (fused_mlp_mse), for networks narrow enough that every layer's
// weights and a block of rows' activations live in shared memory: Linear layers of at most kFusedMlpMaxWidth
// features in and out, float32, one activation between them (kNone, kRelu or kTanh), none after the last.
inline constexpr int kFusedMlpMaxLayers = 8;
inline constexpr std::int64_t kFusedMlpMaxWidth = 64;
inline constexpr std::int64_t kFusedMlpRowsPerBlock = 16;
// The shared memory the CUDA pass may take: what every GPU from sm_80 on can give one block.
inline constexpr std::int64_t kFusedMlpMaxSharedBytes = 96 * 1024;
struct FusedMlpLayer {
  const float* weight;  // [out, in]
  const float* bias;    // [out] or null
  float* weight_grad;   // written, not added to
  float* bias_grad;     // null when bias is
  std::int64_t in, out;
};
struct FusedMlpArgs {
  FusedMlpLayer layers[kFusedMlpMaxLayers];
  int layer_count;
  Activation activation;
  const float* x;  // [rows, layers[0].in]
  const float* y;  // [rows, layers[last].out]
  std::int64_t rows;
  float* partials;           // CUDA: fused_mlp_partials(args) floats of scratch; unused on the CPU
  float* loss;               // [1]: the mean squared error
};
// The parameters of `args`' layers (weights and biases).
inline std::int64_t fused_mlp_parameters(const FusedMlpArgs& args) {
  std::int64_t n = 0;
  for (int l = 0; l < args.layer_count; ++l) {
    n += args.layers[l].out * args.layers[l].in + (args.layers[l].bias != nullptr ? args.layers[l].out : 0);
  }
  return n;
}
// The CUDA pass's scratch: each block's partial gradients and loss.
inline std::int64_t fused_mlp_partials(const FusedMlpArgs& args) {
  const std::int64_t blocks = (args.rows + kFusedMlpRowsPerBlock - 1) / kFusedMlpRowsPerBlock;
  return blocks * (fused_mlp_parameters(args) + 1);
}
// The CUDA pass's shared memory: every layer's weights and biases, a block's activations at every width (rows of
// weights and activations one float longer than their width, so that threads reading a column hit different
// banks), two buffers of a block's gradients.
inline std::int64_t fused_mlp_shared_bytes(const FusedMlpArgs& args) {
  std::int64_t floats = kFusedMlpRowsPerBlock * (args.layers[0].in + 1) + 2 * kFusedMlpRowsPerBlock * kFusedMlpMaxWidth;
  for (int l = 0; l < args.layer_count; ++l) {
    const FusedMlpLayer& layer = args.layers[l];
    floats += layer.out * (layer.in + 1) + (layer.bias != nullptr ? layer.out : 0) +
              kFusedMlpRowsPerBlock * (layer.out + 1);
  }
  return floats * static_cast<std::int64_t>(sizeof(float));
}

// A veto word's value when nothing vetoes (take_next_row, copy_samples_checked).
constexpr std::int64_t kNoVeto = INT64_MAX;

// Where a gather of consecutive batches stands, in device memory (gather_batch below): the next batch starts at
// `position` of the order, the order ends at `end`, and the kernel counts its blocks in `arrivals` (zero between
// launches) so that its last block can move `position` on after every block has read it.
struct GatherCursor {
  std::int64_t position;
  std::int64_t end;
  std::uint32_t arrivals;
};

// Graph-capturable steps: when `device_scalars` is not null, the step reads its scalars from there (memory of
// the step's device, written by write_sgd_scalars / write_adamw_scalars before the step runs) instead of
// deriving them from the fields above. A CUDA graph that captured the step then replays with each step's
// learning rate and bias corrections, and the host never waits: the write is a launch whose arguments carry
// the values.
struct SgdParams {
  double lr;
  double momentum;      // 0 disables the buffer
  double dampening;     // PyTorch's dampening (0 by default)
  double weight_decay;  // L2, added to the gradient as in torch.optim.SGD
  bool nesterov;
  bool first_step;      // PyTorch initialises the momentum buffer to the gradient on the first step
  const SgdScalars* device_scalars;
};
struct AdamWParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;  // decoupled: param *= 1 − lr·wd before the Adam update
  std::int64_t step;    // 1-based step count after this update, for bias correction
  const AdamWScalars* device_scalars;
};

inline SgdScalars sgd_scalars(const SgdParams& p) {
  SgdScalars s{};
  s.lr = static_cast<float>(p.lr);
  s.momentum = static_cast<float>(p.momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - p.dampening);
  s.weight_decay = static_cast<float>(p.weight_decay);
  s.nesterov = p.nesterov;
  s.first_step = p.first_step;
  s.use_momentum = p.momentum != 0.0;
  return s;
}

// `p.step` must be >= 1 (the caller checks).
inline AdamWScalars adamw_scalars(const AdamWParams& p) {
  const double t = static_cast<double>(p.step);
  const double bias_c1 = 1.0 - std::pow(p.beta1, t);
  const double bias_c2 = 1.0 - std::pow(p.beta2, t);
  AdamWScalars s{};
  s.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  s.beta1 = static_cast<float>(p.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  s.beta2 = static_cast<float>(p.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  s.step_size = static_cast<float>(p.lr / bias_c1);
  s.bias_c2_sqrt = static_cast<float>(std::sqrt(bias_c2));
  s.eps = static_cast<float>(p.eps);
  return s;
}
}  // namespace ddp::kernels

namespace ddp::kernels::cpu {
#include "runtime/kernels/kernel_functions.inc"
}  // namespace ddp::kernels::cpu

namespace ddp::kernels::cuda {
#include "runtime/kernels/kernel_functions.inc"
}  // namespace ddp::kernels::cuda
