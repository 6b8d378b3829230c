// The model in the run's precision (see precision_model.h).
#include "runtime/training/precision_model.h"

namespace ddp::training {

PrecisionModel::PrecisionModel(MLP& mlp, Precision precision) : mlp_(mlp), bf16_(precision == Precision::kBFloat16) {
  if (precision == Precision::kTF32) mlp_.set_math_mode(MathMode::kTF32);
}

void PrecisionModel::attach(Optimizer& optimizer, const Stream& stream) {
  if (!bf16_) return;
  weights_ = std::make_unique<Bf16Weights>(*mlp_.parameter_store(), stream);
  optimizer.set_bf16_copy(weights_->flat());
}

void PrecisionModel::refresh(const Stream& stream) {
  if (weights_) weights_->refresh(stream);
}

Tensor PrecisionModel::forward(const Tensor& x, const Stream& stream, DType dtype) const {
  return weights_ ? forward_bf16(mlp_, *weights_, x, stream, dtype) : mlp_.forward(x, stream);
}

}  // namespace ddp::training
