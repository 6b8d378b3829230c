// The model in the run's precision: FP32 (or TF32) GEMMs on the parameters themselves, or bf16 GEMMs on a bf16
// copy that the optimizer refreshes in its own pass, with FP32 master weights (as autocast;
// runtime/models/bf16_weights.h). bf16 takes a Sequential of Linear and ReLU/GELU layers (an MLP); other
// models train in FP32 or TF32.
#pragma once

#include <memory>
#include <string>

#include "runtime/models/bf16_weights.h"
#include "runtime/models/module.h"
#include "runtime/optim/optimizer.h"
#include "runtime/training/trainer_options.h"

namespace ddp::training {

// Why `model` cannot train in `precision`, or "".
std::string precision_problem(const Module& model, Precision precision);

class PrecisionModel {
 public:
  // TF32 sets every Linear of the model's tree to TF32 GEMMs. InvalidArgument where precision_problem says.
  PrecisionModel(Module& model, Precision precision);
  // After DistributedDataParallel has laid out the store (the copy follows that layout).
  void attach(Optimizer& optimizer, const Stream& stream);
  // After parameters were loaded from elsewhere (a checkpoint).
  void refresh(const Stream& stream);
  // The model's output for `x`; `dtype` float32 where a caller needs it so (argmax, a regression's loss, a loss
  // of one's own), else as the precision makes it.
  Tensor forward(const Tensor& x, const Stream& stream, DType dtype = DType::kBFloat16) const;
  Module& model() const { return model_; }

 private:
  Module& model_;
  const Sequential* bf16_sequential_ = nullptr;  // the model, when it trains in bf16
  std::unique_ptr<Bf16Weights> weights_;
};

}  // namespace ddp::training
