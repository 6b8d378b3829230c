// The model in the run's precision (see precision_model.h).
#include "runtime/training/precision_model.h"

#include "runtime/core/check.h"
#include "runtime/models/layers.h"

namespace ddp::training {
namespace {

void set_tf32(Module& module) {
  if (auto* linear = dynamic_cast<Linear*>(&module)) linear->set_math_mode(MathMode::kTF32);
  for (const auto& [name, child] : module.children()) set_tf32(*child);
}

}  // namespace

std::string precision_problem(const Module& model, Precision precision) {
  if (precision != Precision::kBFloat16) return "";
  const auto* sequential = dynamic_cast<const Sequential*>(&model);
  if (sequential == nullptr) {
    return "bf16 precision takes a Sequential of Linear and ReLU/GELU layers (an MLP); this model is " +
           model.type_name() + ": train it in fp32 or tf32";
  }
  for (const auto& [name, child] : sequential->children()) {
    const auto* act = dynamic_cast<const ActivationLayer*>(child.get());
    if (act != nullptr && !fused_activation(act->activation())) {
      return std::string("bf16 precision takes relu or gelu activations; train ") + activation_name(act->activation()) +
             " in fp32 or tf32";
    }
    if (act == nullptr && dynamic_cast<const Linear*>(child.get()) == nullptr) {
      return "bf16 precision takes a Sequential of Linear and ReLU/GELU layers (an MLP); layer " + name + " is " +
             child->type_name() + ": train this model in fp32 or tf32";
    }
  }
  return "";
}

PrecisionModel::PrecisionModel(Module& model, Precision precision) : model_(model) {
  const std::string problem = precision_problem(model, precision);
  if (!problem.empty()) throw InvalidArgument(problem);
  if (precision == Precision::kTF32) set_tf32(model_);
  if (precision == Precision::kBFloat16) bf16_sequential_ = dynamic_cast<const Sequential*>(&model_);
}

void PrecisionModel::attach(Optimizer& optimizer, const Stream& stream) {
  if (bf16_sequential_ == nullptr) return;
  weights_ = std::make_unique<Bf16Weights>(*model_.parameter_store(), stream);
  optimizer.set_bf16_copy(weights_->flat());
}

void PrecisionModel::refresh(const Stream& stream) {
  if (weights_) weights_->refresh(stream);
}

Tensor PrecisionModel::forward(const Tensor& x, const Stream& stream, DType dtype) const {
  return weights_ ? forward_bf16(*bf16_sequential_, *weights_, x, stream, dtype) : model_.forward(x, stream);
}

}  // namespace ddp::training
