// The layers an MLP is made of: Linear (PyTorch's default initialisation), activations, Sequential and MLP; and
// the layers of the MLP family around them (LayerNorm, residual blocks, a frequency encoding, Dropout,
// embeddings of categorical columns), each named as its torch.nn twin so a state_dict loads there. Those run in
// float32 only (bf16 weights cover Linear; TF32 applies to Linear's GEMMs) and can be captured in a CUDA graph.
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

// torch.nn.LayerNorm(normalized_shape) over the last dimension, elementwise_affine: parameters "weight" (ones)
// and "bias" (zeros) [normalized_shape].
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t normalized_shape, double eps = 1e-5, const Device& device = Device::cpu(),
                     const Stream& stream = current_stream());
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "LayerNorm"; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  std::int64_t normalized_shape() const { return width_; }
  double eps() const { return eps_; }

 private:
  std::int64_t width_;
  double eps_;
  Tensor weight_, bias_;
};

// y = body(x) + (projection ? projection(x) : x): children "body" and "projection", so the state_dict keys are
// those of a torch module with attributes `body` and `projection` ("body.0.weight", "projection.weight").
// Without a projection the body must keep the width (InvalidArgument naming both widths otherwise).
class ResidualBlock : public Module {
 public:
  explicit ResidualBlock(std::shared_ptr<Module> body, std::shared_ptr<Module> projection = nullptr);
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "ResidualBlock"; }
  Module& body() const { return *body_; }
  Module* projection() const { return projection_.get(); }

 private:
  std::shared_ptr<Module> body_, projection_;
};

// The NeRF frequency encoding (ops::frequency_encoding): [rows, in] to [rows, out_features()] with the columns
// [x (if include_input), sin(2^0·π·x), cos(2^0·π·x), ..., sin(2^(L−1)·π·x), cos(2^(L−1)·π·x)], each block
// `in_features` wide. No parameters.
class FrequencyEncoding : public Module {
 public:
  FrequencyEncoding(std::int64_t in_features, std::int64_t num_frequencies, bool include_input = true);
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "FrequencyEncoding"; }
  std::int64_t in_features() const { return in_; }
  std::int64_t num_frequencies() const { return frequencies_; }
  bool include_input() const { return include_input_; }
  std::int64_t out_features() const { return in_ * ((include_input_ ? 1 : 0) + 2 * frequencies_); }

 private:
  std::int64_t in_, frequencies_;
  bool include_input_;
};

// torch.nn.Dropout(p): the identity in eval mode and for p == 0; in training mode ops::dropout with this
// module's seed and its draw counter, an int64 buffer "draw" on the module's device that every training forward
// advances by a kernel (a captured step draws a new mask at each replay with no host work). The counter is a
// buffer, not a parameter: not in state_dict() (torch's Dropout has no state), saved by training checkpoints so
// a resumed run draws the masks it would have drawn.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, std::uint64_t seed = 0, const Device& device = Device::cpu(),
                   const Stream& stream = current_stream());
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "Dropout"; }
  double p() const { return p_; }
  std::uint64_t seed() const { return seed_; }
  const Tensor& draw() const { return draw_; }  // int64 [1]: the next forward's draw

 private:
  double p_;
  std::uint64_t seed_;
  Tensor draw_;
};

// torch.nn.Embedding(num_embeddings, embedding_dim): parameter "weight" [num, dim] drawn from N(0, 1) at counters
// [offset, offset + num·dim) of kernels::normal(seed). forward takes int32 indices [n] and gives [n, dim]
// (ops::embedding: what an out-of-range index does is said there).
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, std::uint64_t seed = 0,
            std::uint64_t offset = 0, const Device& device = Device::cpu(), const Stream& stream = current_stream());
  Tensor forward(const Tensor& indices, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "Embedding"; }
  const Tensor& weight() const { return weight_; }
  std::int64_t num_embeddings() const { return num_; }
  std::int64_t embedding_dim() const { return dim_; }
  std::uint64_t init_counters() const { return static_cast<std::uint64_t>(num_ * dim_); }

 private:
  std::int64_t num_, dim_;
  Tensor weight_;
};

// torch.nn.ModuleList: modules under "0", "1", ... that another module calls; it has no forward of its own.
class ModuleList : public Module {
 public:
  void add(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;  // InvalidArgument
  std::string type_name() const override { return "ModuleList"; }
  std::size_t size() const { return children().size(); }
  Module& operator[](std::size_t i) const { return *children()[i].second; }
};

// Categorical columns beside float features, for a float feature matrix: the input [batch, k + f] holds in its
// first k columns category ids as exact integers (column j in [0, cardinalities[j])), and the output
// [batch, k·dim + f] is concat(emb_0(col_0), ..., emb_{k−1}(col_{k−1}), x[:, k:]). The embeddings are the child
// "embeddings" (a ModuleList: "embeddings.0.weight", ...), each drawn from its own counter range of `seed`.
// An id that is not an integer in range is an InvalidArgument naming row, column and value on the CPU; on a GPU
// (no host read inside a captured step) it embeds as a row of zeros, never a read out of bounds.
class CategoricalFeatures : public Module {
 public:
  CategoricalFeatures(std::vector<std::int64_t> cardinalities, std::int64_t dim, std::uint64_t seed = 0,
                      const Device& device = Device::cpu(), const Stream& stream = current_stream());
  Tensor forward(const Tensor& x, const Stream& stream = current_stream()) override;
  std::string type_name() const override { return "CategoricalFeatures"; }
  const std::vector<std::int64_t>& cardinalities() const { return cardinalities_; }
  std::int64_t embedding_dim() const { return dim_; }
  // The output width for an input of `in_features` columns (k of them categorical).
  std::int64_t out_features(std::int64_t in_features) const;
  const ModuleList& embeddings() const { return *embeddings_; }

 private:
  std::vector<std::int64_t> cardinalities_;
  std::int64_t dim_;
  std::shared_ptr<ModuleList> embeddings_;
};

}  // namespace ddp
