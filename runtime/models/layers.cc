// Linear, activation layers, Sequential (with Linear+activation fusion) and MLP.
#include "runtime/models/layers.h"

#include <cmath>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"
#include "runtime/ops/activation.h"
#include "runtime/ops/linear.h"

namespace ddp {

Linear::Linear(std::int64_t in, std::int64_t out, bool bias, std::uint64_t seed, std::uint64_t offset,
               const Device& device, const Stream& stream)
    : in_(in), out_(out) {
  DDP_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=" + std::to_string(in) +
                                   " out=" + std::to_string(out));
  set_device(device);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  weight_ = register_parameter("weight", Tensor::uniform({out, in}, -bound, bound, seed, offset, device, stream));
  if (bias) {
    bias_ = register_parameter(
        "bias", Tensor::uniform({out}, -bound, bound, seed, offset + static_cast<std::uint64_t>(out * in), device,
                                stream));
  }
}

std::uint64_t Linear::init_counters() const { return static_cast<std::uint64_t>(out_ * in_ + out_); }

Tensor Linear::forward(const Tensor& x, const Stream& stream) {
  return forward_fused(x, Activation::kNone, stream);
}

Tensor Linear::forward_fused(const Tensor& x, Activation act, const Stream& stream) {
  return ops::linear(x, weight_, bias_, act, stream, math_);
}

Tensor ActivationLayer::forward(const Tensor& x, const Stream& stream) { return ops::activation(x, act_, stream); }

std::string ActivationLayer::type_name() const {
  switch (act_) {
    case Activation::kRelu:
      return "ReLU";
    case Activation::kGelu:
      return "GELU";
    case Activation::kTanh:
      return "Tanh";
    case Activation::kSigmoid:
      return "Sigmoid";
    case Activation::kNone:
      break;
  }
  return "Identity";
}

void Sequential::add(std::shared_ptr<Module> module) {
  register_module(std::to_string(children().size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& x, const Stream& stream) {
  PhaseGuard phase(Phase::kForward);
  Tensor h = x;
  const auto& kids = children();
  for (std::size_t i = 0; i < kids.size(); ++i) {
    // A Linear followed by ReLU or GELU runs as one fused linear; Tanh and Sigmoid run as layers of their own.
    auto* linear = dynamic_cast<Linear*>(kids[i].second.get());
    auto* act = i + 1 < kids.size() ? dynamic_cast<ActivationLayer*>(kids[i + 1].second.get()) : nullptr;
    if (linear != nullptr && act != nullptr && act->activation() != Activation::kNone &&
        fused_activation(act->activation())) {
      h = linear->forward_fused(h, act->activation(), stream);
      ++i;
      continue;
    }
    h = kids[i].second->forward(h, stream);
  }
  return h;
}

MLP::MLP(const std::vector<std::int64_t>& sizes, Activation activation, std::uint64_t seed,
         const Device& device, const Stream& stream)
    : sizes_(sizes), activation_(activation) {
  DDP_CHECK(sizes.size() >= 2, "MLP: needs at least an input and an output size, got " + shape_str(sizes));
  set_device(device);
  std::uint64_t offset = 0;
  for (std::size_t k = 0; k + 1 < sizes.size(); ++k) {
    auto layer = std::make_shared<Linear>(sizes[k], sizes[k + 1], true, seed, offset, device, stream);
    offset += layer->init_counters();
    add(layer);
    if (k + 2 < sizes.size()) add(std::make_shared<ActivationLayer>(activation));
  }
}

void MLP::set_math_mode(MathMode math) {
  for (const auto& [name, child] : children())
    if (auto* l = dynamic_cast<Linear*>(child.get())) l->set_math_mode(math);
}

}  // namespace ddp
