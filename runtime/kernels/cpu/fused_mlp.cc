// The CPU side of the kernels' fused_mlp_mse: the same pass (forward, mean squared error, backward) row by row,
// for a CPU session's fused step and as the reference of the CUDA kernel's arithmetic.
#include <cmath>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cpu {
namespace {

float hidden_activation(Activation act, float z) {
  if (act == Activation::kRelu) return z > 0.0f ? z : 0.0f;
  if (act == Activation::kTanh) return std::tanh(z);
  return z;
}
float hidden_activation_grad(Activation act, float out) {
  if (act == Activation::kRelu) return out > 0.0f ? 1.0f : 0.0f;
  if (act == Activation::kTanh) return 1.0f - out * out;
  return 1.0f;
}

}  // namespace

void fused_mlp_mse(const FusedMlpArgs& a, StreamHandle /*stream*/) {
  DDP_CHECK(a.layer_count >= 1 && a.layer_count <= kFusedMlpMaxLayers && a.rows >= 1,
            "fused_mlp_mse: 1 to 8 layers and at least one row");
  const int layers = a.layer_count;
  // Every row's activations at every width (act[0] = x).
  std::vector<std::vector<float>> act(static_cast<std::size_t>(layers) + 1);
  act[0].assign(a.x, a.x + a.rows * a.layers[0].in);
  for (int l = 0; l < layers; ++l) {
    const FusedMlpLayer& layer = a.layers[l];
    std::vector<float>& out = act[static_cast<std::size_t>(l) + 1];
    out.resize(static_cast<std::size_t>(a.rows * layer.out));
    for (std::int64_t r = 0; r < a.rows; ++r) {
      for (std::int64_t j = 0; j < layer.out; ++j) {
        float z = layer.bias != nullptr ? layer.bias[j] : 0.0f;
        for (std::int64_t k = 0; k < layer.in; ++k) z = std::fma(act[l][r * layer.in + k], layer.weight[j * layer.in + k], z);
        out[r * layer.out + j] = l + 1 < layers ? hidden_activation(a.activation, z) : z;
      }
    }
  }
  const std::int64_t width = a.layers[layers - 1].out, n = a.rows * width;
  const float scale = 2.0f / static_cast<float>(n);
  std::vector<float> grad(static_cast<std::size_t>(n));
  double squares = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = act[layers][i] - a.y[i];
    squares += static_cast<double>(d) * d;
    grad[i] = scale * d;
  }
  *a.loss = static_cast<float>(squares / static_cast<double>(n));
  for (int l = layers - 1; l >= 0; --l) {
    const FusedMlpLayer& layer = a.layers[l];
    if (l + 1 < layers) {
      for (std::int64_t i = 0; i < a.rows * layer.out; ++i) {
        grad[i] *= hidden_activation_grad(a.activation, act[static_cast<std::size_t>(l) + 1][i]);
      }
    }
    for (std::int64_t j = 0; j < layer.out; ++j) {
      for (std::int64_t k = 0; k < layer.in; ++k) {
        float s = 0.0f;
        for (std::int64_t r = 0; r < a.rows; ++r) s = std::fma(grad[r * layer.out + j], act[l][r * layer.in + k], s);
        layer.weight_grad[j * layer.in + k] = s;
      }
      if (layer.bias_grad != nullptr) {
        float s = 0.0f;
        for (std::int64_t r = 0; r < a.rows; ++r) s += grad[r * layer.out + j];
        layer.bias_grad[j] = s;
      }
    }
    if (l == 0) break;
    std::vector<float> next(static_cast<std::size_t>(a.rows * layer.in), 0.0f);
    for (std::int64_t r = 0; r < a.rows; ++r) {
      for (std::int64_t k = 0; k < layer.in; ++k) {
        float s = 0.0f;
        for (std::int64_t j = 0; j < layer.out; ++j) s = std::fma(grad[r * layer.out + j], layer.weight[j * layer.in + k], s);
        next[r * layer.in + k] = s;
      }
    }
    grad.swap(next);
  }
}

}  // namespace ddp::kernels::cpu
