// The layers an MLP is made of: Linear (PyTorch's default initialisation), activations, Sequential and MLP.
//
// Initialisation is seeded and device independent: a Linear draws its weight from counters
// [offset, offset + out·in) and its bias from the next `out` counters of kernels::uniform(seed), so the same
// seed gives the same model on the CPU and the GPU, and MLP gives every layer its own counter range.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/activation.h"
#include "runtime/core/math_mode.h"
#include "runtime/models/module.h"

namespace ddp {

class Linear : public Module {
 public:
  // torch.nn.Linear's defaults: weight ~ U(−1/√in, 1/√in) (kaiming_uniform with a = √5), bias likewise.
  Linear(std::int64_t in, std::int64_t out, bool bias = true, std::uint64_t seed = 0, std::uint64_t offset = 0,
         const Device& device = Device::cpu(), const Stream& stream = current_stream());
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  // forward with the activation fused into the GEMM epilogue.
  Tensor forward_fused(const Tensor& x, Activation act, const Stream& stream = current_stream());
  std::string type_name() const override { return "Linear"; }

  const Tensor& weight() const { return weight_; }  // [out, in]
  const Tensor& bias() const { return bias_; }      // [out] or undefined
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  // Counters this layer's initialisation consumes (out·in + out).
  std::uint64_t init_counters() const;
  // FP32 or TF32 GEMMs on the GPU.
  void set_math_mode(MathMode math) { math_ = math; }
  MathMode math_mode() const { return math_; }

 private:
  std::int64_t in_, out_;
  Tensor weight_, bias_;
  MathMode math_ = MathMode::kFloat32;
};

// A parameter-free activation layer (nn.ReLU / nn.GELU): it occupies an index in a Sequential, like PyTorch.
class ActivationLayer : public Module {
 public:
  explicit ActivationLayer(Activation act) : act_(act) {}
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override;
  Activation activation() const { return act_; }

 private:
  Activation act_;
};

class Sequential : public Module {
 public:
  Sequential() = default;
  // Appends `module` under the next index ("0", "1", ...).
  void add(std::shared_ptr<Module> module);
  // Runs the children in order; a Linear followed by ReLU/GELU runs as one fused linear.
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "Sequential"; }
  std::size_t size() const { return children().size(); }
  Module& operator[](std::size_t i) const { return *children()[i].second; }
};

// sizes = {784, 256, 10} builds Linear(784,256), Act, Linear(256,10): the indices of nn.Sequential with the
// same layers, so the state dict keys are 0.weight, 0.bias, 2.weight, 2.bias.
class MLP : public Sequential {
 public:
  MLP(const std::vector<std::int64_t>& sizes, Activation activation = Activation::kRelu,
      std::uint64_t seed = 0, const Device& device = Device::cpu(), const Stream& stream = current_stream());
  std::string type_name() const override { return "MLP"; }
  void set_math_mode(MathMode math);
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  Activation activation() const { return activation_; }

 private:
  std::vector<std::int64_t> sizes_;
  Activation activation_;
};

}  // namespace ddp
