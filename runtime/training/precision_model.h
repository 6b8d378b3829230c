// The model in the run's precision: FP32 (or TF32) GEMMs on the parameters themselves, or bf16 GEMMs on a bf16
// copy that the optimizer refreshes in its own pass, with FP32 master weights (as autocast; runtime/models/bf16_weights.h).
#pragma once

#include <memory>

#include "runtime/models/bf16_weights.h"
#include "runtime/models/layers.h"
#include "runtime/optim/optimizer.h"
#include "runtime/training/trainer.h"

namespace ddp::training {

class PrecisionModel {
 public:
  PrecisionModel(MLP& mlp, Precision precision);
  // After DistributedDataParallel has laid out the store (the copy follows that layout).
  void attach(Optimizer& optimizer, const Stream& stream);
  // After parameters were loaded from elsewhere (a checkpoint).
  void refresh(const Stream& stream);
  // The model's output for `x`; `dtype` float32 where a caller needs it so (argmax, a regression's loss), else
  // as the precision makes it.
  Tensor forward(const Tensor& x, const Stream& stream, DType dtype = DType::kBFloat16) const;
  MLP& mlp() const { return mlp_; }

 private:
  MLP& mlp_;
  bool bf16_;
  std::unique_ptr<Bf16Weights> weights_;
};

}  // namespace ddp::training
