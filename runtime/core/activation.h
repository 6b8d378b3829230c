// The activation a layer applies: a public concept (ddp::MLP, ddp::Linear, ops::linear take one), so it lives
// in core, below the kernels that implement it, and a user's program reaches it without the kernel layer.
#pragma once

#include <cstdint>
#include <string>

namespace ddp {

// GELU is the exact (erf) form, as torch.nn.GELU() by default; SiLU is x·sigmoid(x), as torch.nn.SiLU().
// kTanh, kSigmoid and kSilu run as standalone activations only (float32): the linear kernels' fused epilogues
// take kNone, kRelu and kGelu (fused_activation says which).
enum class Activation : std::uint8_t { kNone, kRelu, kGelu, kTanh, kSigmoid, kSilu };
constexpr bool fused_activation(Activation act) {
  return act == Activation::kNone || act == Activation::kRelu || act == Activation::kGelu;
}

// The one spelling of each activation, as command lines, the C API, checkpoints' metadata and the autograd tape
// use it: "relu", "gelu", "tanh", "sigmoid", "silu" ("identity" for kNone).
const char* activation_name(Activation act);
// The inverse for the five a layer applies; InvalidArgument naming the choices otherwise.
Activation parse_activation(const std::string& name);

}  // namespace ddp
