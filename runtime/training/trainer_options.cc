// The names of the trainer's options and their values (see trainer_options.h).
#include "runtime/training/trainer_options.h"

#include "runtime/core/check.h"

namespace ddp {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "tf32") return Precision::kTF32;
  if (name == "bf16") return Precision::kBFloat16;
  throw InvalidArgument("unknown precision '" + name + "': use fp32, tf32 or bf16");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kTF32:
      return "tf32";
    case Precision::kBFloat16:
      return "bf16";
    default:
      return "fp32";
  }
}

Loss parse_loss(const std::string& name) {
  if (name == "cross-entropy") return Loss::kCrossEntropy;
  if (name == "mse") return Loss::kMse;
  throw InvalidArgument("unknown loss '" + name + "': use cross-entropy or mse");
}

std::string loss_name(Loss loss) { return loss == Loss::kMse ? "mse" : "cross-entropy"; }

std::unique_ptr<Optimizer> make_optimizer(const TrainerOptions& o, Module& model, const Stream& stream) {
  if (const auto* sgd = std::get_if<SgdOptions>(&o.optimizer)) return std::make_unique<Sgd>(model, *sgd, stream);
  return std::make_unique<AdamW>(model, std::get<AdamWOptions>(o.optimizer), stream);
}

double optimizer_lr(const TrainerOptions& o) {
  return std::visit([](const auto& options) { return options.lr; }, o.optimizer);
}

std::string option_text(const TrainerOptions& o, const std::string& option, const std::string& value) {
  if (o.option_name) return o.option_name(option, value);
  // What a checkpoint records of the model's activation is the model's, not an option's.
  if (option == "activation") return "the model's activation";
  return "TrainerOptions::" + option + (value.empty() ? "" : " = " + value);
}

}  // namespace ddp
