// FusedMlpMse: the MLP's Linear layers as the kernels' FusedMlpArgs, then one fused_mlp_mse launch.
#include "runtime/models/fused_mlp_mse.h"

#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/dispatch.h"

namespace ddp {
namespace {

std::vector<Linear*> linear_layers(const MLP& model) {
  std::vector<Linear*> linears;
  for (std::size_t i = 0; i < model.size(); ++i) {
    if (auto* linear = dynamic_cast<Linear*>(&model[i])) linears.push_back(linear);
  }
  return linears;
}

// The kernels' arguments for `model` (data pointers left to the caller).
kernels::FusedMlpArgs layer_args(const MLP& model) {
  kernels::FusedMlpArgs args{};
  const std::vector<Linear*> linears = linear_layers(model);
  args.layer_count = static_cast<int>(linears.size());
  args.activation = model.activation();
  for (std::size_t l = 0; l < linears.size() && l < static_cast<std::size_t>(kernels::kFusedMlpMaxLayers); ++l) {
    const Linear& linear = *linears[l];
    kernels::FusedMlpLayer& layer = args.layers[l];
    layer.in = linear.in_features();
    layer.out = linear.out_features();
    layer.weight = linear.weight().data<float>();
    layer.weight_grad = linear.weight().grad().defined() ? linear.weight().grad().data<float>() : nullptr;
    if (linear.bias().defined()) {
      layer.bias = linear.bias().data<float>();
      layer.bias_grad = linear.bias().grad().defined() ? linear.bias().grad().data<float>() : nullptr;
    }
  }
  return args;
}

}  // namespace

std::string FusedMlpMse::unfit_reason(const MLP& model) {
  const Activation act = model.activation();
  if (act != Activation::kNone && act != Activation::kRelu && act != Activation::kTanh) {
    return std::string("its activation is ") + activation_name(act) + " (the fused pass takes relu, tanh or none)";
  }
  const std::vector<Linear*> linears = linear_layers(model);
  if (linears.empty() || linears.size() > static_cast<std::size_t>(kernels::kFusedMlpMaxLayers)) {
    return "it has " + std::to_string(linears.size()) + " linear layers (the fused pass takes 1 to " +
           std::to_string(kernels::kFusedMlpMaxLayers) + ")";
  }
  for (const Linear* linear : linears) {
    if (linear->in_features() > kernels::kFusedMlpMaxWidth || linear->out_features() > kernels::kFusedMlpMaxWidth) {
      return "a layer is " + std::to_string(linear->in_features()) + " x " + std::to_string(linear->out_features()) +
             " (the fused pass takes layers at most " + std::to_string(kernels::kFusedMlpMaxWidth) + " wide)";
    }
    if (linear->weight().dtype() != DType::kFloat32) return "its weights are not float32";
    if (!linear->weight().grad().defined() || (linear->bias().defined() && !linear->bias().grad().defined())) {
      return "its parameters have no gradients yet (make the optimizer first)";
    }
  }
  const kernels::FusedMlpArgs args = layer_args(model);
  if (kernels::fused_mlp_shared_bytes(args) > kernels::kFusedMlpMaxSharedBytes) {
    return "its layers need more shared memory than a block has (fewer or narrower layers)";
  }
  return "";
}

FusedMlpMse::FusedMlpMse(MLP& model) : model_(model) {
  const std::string why = unfit_reason(model);
  if (!why.empty()) throw InvalidArgument("FusedMlpMse: the model cannot take the fused pass: " + why);
}

Tensor FusedMlpMse::operator()(const Tensor& x, const Tensor& y, const Stream& stream) {
  kernels::FusedMlpArgs args = layer_args(model_);
  const Device& device = linear_layers(model_)[0]->weight().device();
  const std::int64_t in = args.layers[0].in, out = args.layers[args.layer_count - 1].out;
  if (x.dtype() != DType::kFloat32 || y.dtype() != DType::kFloat32 || x.dim() != 2 || y.dim() != 2 ||
      x.size(1) != in || y.size(1) != out || x.size(0) != y.size(0) || x.size(0) < 1 || x.device() != device ||
      y.device() != device) {
    throw InvalidArgument("FusedMlpMse: x and y must be float32 [rows, " + std::to_string(in) + "] and [rows, " +
                          std::to_string(out) + "] on " + device.str() + ", got " + x.describe() + " and " +
                          y.describe());
  }
  args.x = x.data<float>();
  args.y = y.data<float>();
  args.rows = x.size(0);
  if (!loss_.defined()) loss_ = Tensor::zeros({1}, DType::kFloat32, device, stream);
  args.loss = loss_.data<float>();
  if (device.is_cuda()) {
    const std::int64_t partials = kernels::fused_mlp_partials(args);
    if (!partials_.defined() || partials_.numel() < partials) {
      partials_ = Tensor::empty({partials}, DType::kFloat32, device, stream);
    }
    args.partials = partials_.data<float>();
  }
  DDP_DISPATCH(device, fused_mlp_mse, args, stream.handle());
  // Written, as a backward writes them: a later backward before zero_grad adds to them.
  for (Linear* linear : linear_layers(model_)) {
    linear->weight().autograd_meta().grad_valid = true;
    if (linear->bias().defined()) linear->bias().autograd_meta().grad_valid = true;
  }
  return loss_;
}

}  // namespace ddp
