#include "runtime/core/activation.h"

#include "runtime/core/check.h"

namespace ddp {
namespace {

constexpr Activation kNamed[] = {Activation::kRelu, Activation::kGelu, Activation::kTanh, Activation::kSigmoid,
                                Activation::kSilu};

}  // namespace

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
    case Activation::kSilu:
      return "silu";
    case Activation::kNone:
      break;
  }
  return "identity";
}

Activation parse_activation(const std::string& name) {
  for (Activation act : kNamed) {
    if (name == activation_name(act)) return act;
  }
  throw InvalidArgument("unknown activation '" + name + "': use relu, gelu, tanh, sigmoid or silu");
}

}  // namespace ddp
