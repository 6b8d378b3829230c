// Linear, activation layers, Sequential (with Linear+activation fusion), MLP, and the MLP family's layers over
// runtime/ops/layers.h.
#include "runtime/models/layers.h"

#include <cmath>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"
#include "runtime/ops/activation.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/layers.h"
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
    case Activation::kSilu:
      return "SiLU";
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

LayerNorm::LayerNorm(std::int64_t normalized_shape, double eps, const Device& device, const Stream& stream)
    : width_(normalized_shape), eps_(eps) {
  DDP_CHECK(normalized_shape > 0, "LayerNorm: normalized_shape must be positive, got " +
                                      std::to_string(normalized_shape));
  DDP_CHECK(eps > 0.0, "LayerNorm: eps must be positive, got " + std::to_string(eps));
  set_device(device);
  weight_ = register_parameter("weight", Tensor::full({normalized_shape}, 1.0, DType::kFloat32, device, stream));
  bias_ = register_parameter("bias", Tensor::zeros({normalized_shape}, DType::kFloat32, device, stream));
}

Tensor LayerNorm::forward(const Tensor& x, const Stream& stream) {
  DDP_CHECK(x.defined() && x.dim() >= 1 && x.size(x.dim() - 1) == width_,
            "LayerNorm(" + std::to_string(width_) + "): the input's last dimension must be " + std::to_string(width_) +
                ", got " + (x.defined() ? x.describe() : std::string("an undefined tensor")));
  return ops::layer_norm(x, weight_, bias_, eps_, stream);
}

ResidualBlock::ResidualBlock(std::shared_ptr<Module> body, std::shared_ptr<Module> projection)
    : body_(std::move(body)), projection_(std::move(projection)) {
  DDP_CHECK(body_ != nullptr, "ResidualBlock: the body is null; give the module the block wraps");
  register_module("body", body_);
  if (projection_ != nullptr) register_module("projection", projection_);
}

Tensor ResidualBlock::forward(const Tensor& x, const Stream& stream) {
  const Tensor h = body_->forward(x, stream);
  const Tensor skip = projection_ != nullptr ? projection_->forward(x, stream) : x;
  if (h.shape() != skip.shape()) {
    const std::int64_t body_width = h.dim() > 0 ? h.size(h.dim() - 1) : 0;
    const std::int64_t skip_width = skip.dim() > 0 ? skip.size(skip.dim() - 1) : 0;
    throw InvalidArgument("ResidualBlock: the body gives " + h.describe() + " (width " + std::to_string(body_width) +
                          ") but the " + (projection_ != nullptr ? "projection gives " : "input is ") +
                          skip.describe() + " (width " + std::to_string(skip_width) + "); " +
                          (projection_ != nullptr ? "make the projection's output match the body's"
                                                  : "give a projection, e.g. Linear(" + std::to_string(skip_width) +
                                                        ", " + std::to_string(body_width) + ")"));
  }
  return ops::add(h, skip, stream);
}

FrequencyEncoding::FrequencyEncoding(std::int64_t in_features, std::int64_t num_frequencies, bool include_input)
    : in_(in_features), frequencies_(num_frequencies), include_input_(include_input) {
  DDP_CHECK(in_features > 0, "FrequencyEncoding: in_features must be positive, got " + std::to_string(in_features));
  DDP_CHECK(num_frequencies >= 0 && num_frequencies <= 64,
            "FrequencyEncoding: num_frequencies must be in [0, 64], got " + std::to_string(num_frequencies));
  DDP_CHECK(include_input || num_frequencies > 0,
            "FrequencyEncoding: no frequencies and no input would give no columns; include the input or add one");
}

Tensor FrequencyEncoding::forward(const Tensor& x, const Stream& stream) {
  DDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) == in_,
            "FrequencyEncoding: expects [rows, " + std::to_string(in_) + "], got " +
                (x.defined() ? x.describe() : std::string("an undefined tensor")));
  return ops::frequency_encoding(x, frequencies_, include_input_, stream);
}

Dropout::Dropout(double p, std::uint64_t seed, const Device& device, const Stream& stream) : p_(p), seed_(seed) {
  DDP_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got " + std::to_string(p));
  set_device(device);
  draw_ = register_buffer("draw", Tensor::zeros({1}, DType::kInt64, device, stream));
}

Tensor Dropout::forward(const Tensor& x, const Stream& stream) {
  if (!is_training() || p_ == 0.0) return x;
  return ops::dropout(x, p_, seed_, draw_, stream);
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, std::uint64_t seed,
                     std::uint64_t offset, const Device& device, const Stream& stream)
    : num_(num_embeddings), dim_(embedding_dim) {
  DDP_CHECK(num_embeddings > 0 && num_embeddings <= 0x7fffffff && embedding_dim > 0,
            "Embedding: num_embeddings must be in [1, 2^31 - 1] and embedding_dim positive, got " +
                std::to_string(num_embeddings) + " and " + std::to_string(embedding_dim));
  set_device(device);
  weight_ = register_parameter("weight", Tensor::normal({num_embeddings, embedding_dim}, 0.0f, 1.0f, seed, offset,
                                                        device, stream));
}

Tensor Embedding::forward(const Tensor& indices, const Stream& stream) {
  return ops::embedding(weight_, indices, stream);
}

void ModuleList::add(std::shared_ptr<Module> module) {
  register_module(std::to_string(children().size()), std::move(module));
}

Tensor ModuleList::forward(const Tensor& /*x*/, const Stream& /*stream*/) {
  throw InvalidArgument("ModuleList has no forward: call the modules it holds");
}

CategoricalFeatures::CategoricalFeatures(std::vector<std::int64_t> cardinalities, std::int64_t dim,
                                         std::uint64_t seed, const Device& device, const Stream& stream)
    : cardinalities_(std::move(cardinalities)), dim_(dim), embeddings_(std::make_shared<ModuleList>()) {
  DDP_CHECK(!cardinalities_.empty(), "CategoricalFeatures: no categorical columns; give one cardinality per column");
  register_module("embeddings", embeddings_);
  set_device(device);
  std::uint64_t offset = 0;
  for (std::int64_t cardinality : cardinalities_) {
    auto table = std::make_shared<Embedding>(cardinality, dim, seed, offset, device, stream);
    offset += table->init_counters();
    embeddings_->add(std::move(table));
  }
}

std::int64_t CategoricalFeatures::out_features(std::int64_t in_features) const {
  const auto k = static_cast<std::int64_t>(cardinalities_.size());
  return k * dim_ + (in_features - k);
}

Tensor CategoricalFeatures::forward(const Tensor& x, const Stream& stream) {
  const auto k = static_cast<std::int64_t>(cardinalities_.size());
  DDP_CHECK(x.defined() && x.dim() == 2 && x.size(1) >= k,
            "CategoricalFeatures: expects [batch, " + std::to_string(k) + " category columns + float features], got " +
                (x.defined() ? x.describe() : std::string("an undefined tensor")));
  std::vector<Tensor> parts;
  for (std::int64_t j = 0; j < k; ++j) {
    const Tensor ids = ops::category_ids(x, j, cardinalities_[static_cast<std::size_t>(j)], stream);
    parts.push_back((*embeddings_)[static_cast<std::size_t>(j)].forward(ids, stream));
  }
  if (x.size(1) > k) parts.push_back(ops::slice_columns(x, k, x.size(1), stream));
  return ops::concat_columns(parts, stream);
}

}  // namespace ddp
