// A narrow MLP's training pass (forward, mean squared error, backward) in two kernels, apart from the layer-by-layer
// path of linear.cu. For an in-situ surrogate (a few inputs, 64 wide, batches of hundreds of rows) that path is
// a dozen and more launches of a few microseconds each, the arithmetic being far smaller than their cost; here
// each block keeps every weight and its rows' activations at every layer in shared memory, so a whole step's
// forward and backward is one launch, and a second sums the blocks' weight gradients in block order, a thread per
// parameter (no atomics on the values: the same bits on every run).
#include <cstdint>

#include "runtime/kernels/cuda/device_utils.cuh"

namespace ddp::kernels::cuda {
namespace {

constexpr int kFusedThreads = 256;
constexpr int kRows = static_cast<int>(kFusedMlpRowsPerBlock);

__device__ __forceinline__ float hidden_activation(Activation act, float z) {
  if (act == Activation::kRelu) return z > 0.0f ? z : 0.0f;
  if (act == Activation::kTanh) return tanhf(z);
  return z;
}
// The derivative from the activation's output (ReLU: 0 where the input was <= 0, as torch's threshold_backward).
__device__ __forceinline__ float hidden_activation_grad(Activation act, float out) {
  if (act == Activation::kRelu) return out > 0.0f ? 1.0f : 0.0f;
  if (act == Activation::kTanh) return 1.0f - out * out;
  return 1.0f;
}

// Where layer l's parameters sit in a block's partials: its weight, then its bias; the loss comes last.
__device__ __forceinline__ std::int64_t parameter_offset(const FusedMlpArgs& a, int layer) {
  std::int64_t at = 0;
  for (int l = 0; l < layer; ++l) at += a.layers[l].out * a.layers[l].in + (a.layers[l].bias ? a.layers[l].out : 0);
  return at;
}

__global__ void __launch_bounds__(kFusedThreads) fused_mlp_mse_kernel(FusedMlpArgs a) {
  detail::begin_kernel();
  extern __shared__ float shared[];
  const int tid = threadIdx.x;
  const int layers = a.layer_count;
  const std::int64_t parameters = parameter_offset(a, layers);
  const std::int64_t first_row = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const int rows_here = a.rows - first_row < kRows ? static_cast<int>(a.rows - first_row) : kRows;

  // Shared memory: each layer's weight (rows of in + 1: W[j][k] at j·(in + 1) + k) and bias, the activations at
  // every width (act[l][r][c] at r·(width + 1) + c; act[0] = x), then two gradient buffers (rows of the width,
  // unpadded: read along rows or broadcast).
  float* weights[kFusedMlpMaxLayers];
  float* biases[kFusedMlpMaxLayers];
  float* act[kFusedMlpMaxLayers + 1];
  int width[kFusedMlpMaxLayers + 1];
  float* at = shared;
  width[0] = static_cast<int>(a.layers[0].in);
  for (int l = 0; l < layers; ++l) {
    width[l + 1] = static_cast<int>(a.layers[l].out);
    weights[l] = at;
    at += a.layers[l].out * (a.layers[l].in + 1);
    biases[l] = a.layers[l].bias ? at : nullptr;
    if (a.layers[l].bias) at += a.layers[l].out;
  }
  for (int l = 0; l <= layers; ++l) {
    act[l] = at;
    at += kRows * (width[l] + 1);
  }
  float* grad = at;
  float* grad_next = at + kRows * kFusedMlpMaxWidth;

  for (int l = 0; l < layers; ++l) {
    const int in = width[l], out = width[l + 1];
    for (int i = tid; i < out * in; i += kFusedThreads) weights[l][(i / in) * (in + 1) + i % in] = a.layers[l].weight[i];
    if (biases[l]) {
      for (int i = tid; i < out; i += kFusedThreads) biases[l][i] = a.layers[l].bias[i];
    }
  }
  for (int i = tid; i < kRows * width[0]; i += kFusedThreads) {
    const int r = i / width[0], c = i % width[0];
    act[0][r * (width[0] + 1) + c] = r < rows_here ? a.x[first_row * width[0] + i] : 0.0f;
  }
  __syncthreads();

  // Forward: act[l + 1] = activation(act[l]·Wᵀ + b), no activation after the last layer.
  for (int l = 0; l < layers; ++l) {
    const int in = width[l], out = width[l + 1];
    for (int i = tid; i < kRows * out; i += kFusedThreads) {
      const int r = i / out, j = i % out;
      float z = biases[l] ? biases[l][j] : 0.0f;
      const float* xr = act[l] + r * (in + 1);
      const float* wj = weights[l] + j * (in + 1);
      for (int k = 0; k < in; ++k) z = fmaf(xr[k], wj[k], z);
      act[l + 1][r * (out + 1) + j] = l + 1 < layers ? hidden_activation(a.activation, z) : z;
    }
    __syncthreads();
  }

  // The loss and its gradient: mean over every output of every row, d/dout = 2 (out − y) / n.
  const int out_width = width[layers];
  const float scale = 2.0f / static_cast<float>(a.rows * out_width);
  float squares = 0.0f;
  for (int i = tid; i < kRows * out_width; i += kFusedThreads) {
    const int r = i / out_width, j = i % out_width;
    float d = 0.0f;
    if (r < rows_here) {
      d = act[layers][r * (out_width + 1) + j] - a.y[first_row * out_width + i];
      squares = fmaf(d, d, squares);
    }
    grad[i] = scale * d;
  }
  __shared__ float warp_sums[kFusedThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_down_sync(0xffffffffu, squares, offset);
  if (tid % 32 == 0) warp_sums[tid / 32] = squares;
  __syncthreads();

  // Backward, last layer first: dz = grad ⊙ activation'(out), dW = dzᵀ·act[l], db = Σ dz, grad_next = dz·W.
  float* partial = a.partials + static_cast<std::int64_t>(blockIdx.x) * (parameters + 1);
  for (int l = layers - 1; l >= 0; --l) {
    const int in = width[l], out = width[l + 1];
    if (l + 1 < layers) {
      for (int i = tid; i < kRows * out; i += kFusedThreads) {
        grad[i] *= hidden_activation_grad(a.activation, act[l + 1][(i / out) * (out + 1) + i % out]);
      }
      __syncthreads();
    }
    const std::int64_t offset = parameter_offset(a, l);
    for (int p = tid; p < out * in; p += kFusedThreads) {
      const int j = p / in, k = p % in;
      float s = 0.0f;
      for (int r = 0; r < kRows; ++r) s = fmaf(grad[r * out + j], act[l][r * (in + 1) + k], s);
      partial[offset + p] = s;
    }
    if (biases[l]) {
      for (int j = tid; j < out; j += kFusedThreads) {
        float s = 0.0f;
        for (int r = 0; r < kRows; ++r) s += grad[r * out + j];
        partial[offset + out * in + j] = s;
      }
    }
    if (l > 0) {
      for (int i = tid; i < kRows * in; i += kFusedThreads) {
        const int r = i / in, k = i % in;
        float s = 0.0f;
        for (int j = 0; j < out; ++j) s = fmaf(grad[r * out + j], weights[l][j * (in + 1) + k], s);
        grad_next[i] = s;
      }
      __syncthreads();
      float* swap = grad;
      grad = grad_next;
      grad_next = swap;
    }
  }
  if (tid == 0) {
    float s = 0.0f;
    for (int w = 0; w < kFusedThreads / 32; ++w) s += warp_sums[w];
    partial[parameters] = s;
  }

}

// The blocks' partials summed in block order (the same bits on every run), a thread per parameter (and one for
// the loss), into the gradients and the loss.
__global__ void fused_mlp_sum_kernel(FusedMlpArgs a, unsigned int blocks) {
  detail::begin_kernel();
  const std::int64_t parameters = parameter_offset(a, a.layer_count);
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p > parameters) return;
  float s = 0.0f;
  for (unsigned int b = 0; b < blocks; ++b) s += a.partials[b * (parameters + 1) + p];
  if (p == parameters) {
    *a.loss = s / static_cast<float>(a.rows * a.layers[a.layer_count - 1].out);
    return;
  }
  int l = 0;
  std::int64_t begin = 0;
  while (p >= begin + a.layers[l].out * a.layers[l].in + (a.layers[l].bias ? a.layers[l].out : 0)) {
    begin += a.layers[l].out * a.layers[l].in + (a.layers[l].bias ? a.layers[l].out : 0);
    ++l;
  }
  const std::int64_t q = p - begin, wn = a.layers[l].out * a.layers[l].in;
  if (q < wn) {
    a.layers[l].weight_grad[q] = s;
  } else {
    a.layers[l].bias_grad[q - wn] = s;
  }
}

}  // namespace

void fused_mlp_mse(const FusedMlpArgs& args, StreamHandle stream) {
  DDP_CHECK(args.layer_count >= 1 && args.layer_count <= kFusedMlpMaxLayers && args.rows >= 1,
            "fused_mlp_mse: 1 to 8 layers and at least one row");
  const std::int64_t bytes = fused_mlp_shared_bytes(args);
  // Once per process: the most shared memory a block of this kernel may ask for (the callers check their model
  // fits, fused_mlp_mse_fits).
  static const bool opted_in = [] {
    DDP_CUDA_CHECK(cudaFuncSetAttribute(fused_mlp_mse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kFusedMlpMaxSharedBytes)));
    return true;
  }();
  (void)opted_in;
  DDP_CHECK(bytes <= kFusedMlpMaxSharedBytes, "fused_mlp_mse: the model's layers do not fit in shared memory");
  const auto blocks = static_cast<unsigned int>((args.rows + kRows - 1) / kRows);
  detail::launch(fused_mlp_mse_kernel, blocks, kFusedThreads, static_cast<std::size_t>(bytes), stream, args);
  const std::int64_t sums = fused_mlp_parameters(args) + 1;
  detail::launch(fused_mlp_sum_kernel, static_cast<unsigned int>((sums + 255) / 256), 256, 0, stream, args, blocks);
}

}  // namespace ddp::kernels::cuda
