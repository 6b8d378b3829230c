// A model as an ONNX graph, built with ONNX's own protobuf classes and checked by ONNX's checker.
#include "runtime/training/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"

namespace ddp {
namespace {

// Opset 17 is the newest ONNX 1.12 (Debian 12's libonnx) checks; every operator used here exists since 13-14.
constexpr std::int64_t kOpset = 17;

// Walks a module tree and appends its layers' nodes; `value` is the name of the tensor flowing through. Widths
// are tracked as an affine function of the model's input width (scale·input + shift), so a model that starts
// with a layer not knowing its input width (CategoricalFeatures: its float features) learns it from the first
// layer that does (a Linear's in_features), and every layer's width is checked against the one before it.
class GraphBuilder {
 public:
  GraphBuilder(onnx::GraphProto& graph, const Stream& stream, std::int64_t input_width)
      : graph_(graph), stream_(stream), input_width_(input_width) {}

  void add_module(const Module& module, const std::string& prefix, std::string& value) {
    if (const auto* seq = dynamic_cast<const Sequential*>(&module)) {
      for (const auto& [name, child] : seq->children()) add_module(*child, join(prefix, name), value);
    } else if (const auto* linear = dynamic_cast<const Linear*>(&module)) {
      add_linear(*linear, prefix, value);
    } else if (const auto* act = dynamic_cast<const ActivationLayer*>(&module)) {
      add_activation(act->activation(), prefix, value);
    } else if (const auto* norm = dynamic_cast<const LayerNorm*>(&module)) {
      add_layer_norm(*norm, prefix, value);
    } else if (const auto* block = dynamic_cast<const ResidualBlock*>(&module)) {
      add_residual(*block, prefix, value);
    } else if (const auto* encoding = dynamic_cast<const FrequencyEncoding*>(&module)) {
      add_frequency_encoding(*encoding, prefix, value);
    } else if (const auto* categorical = dynamic_cast<const CategoricalFeatures*>(&module)) {
      add_categorical(*categorical, prefix, value);
    } else if (dynamic_cast<const Dropout*>(&module) != nullptr) {
      return;  // the identity at inference, as torch.onnx exports it in eval mode
    } else {
      throw InvalidArgument("export_onnx: layer '" + prefix + "' is a " + module.type_name() +
                            ", which has no ONNX mapping; export_onnx takes trees of Sequential, Linear, "
                            "activation, LayerNorm, ResidualBlock, FrequencyEncoding, CategoricalFeatures and "
                            "Dropout layers");
    }
  }

  // The model's input width, -1 while no layer has told it.
  std::int64_t input_width() const { return input_width_; }
  // The width of what flows out so far, -1 while it depends on an input width still unknown.
  std::int64_t width() const {
    if (scale_ == 0) return shift_;
    return input_width_ >= 0 ? scale_ * input_width_ + shift_ : -1;
  }

 private:
  static std::string join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }
  std::string fresh(const std::string& base) { return base + "_" + std::to_string(counter_++); }

  // The layer at `prefix` takes `expected` features: checked against the width so far, or, when that still
  // depends on the unknown input width, the input width that gives it.
  void require_width(std::int64_t expected, const std::string& prefix) {
    const std::int64_t have = width();
    if (have < 0) {
      const std::int64_t rest = expected - shift_;
      if (rest > 0 && rest % scale_ == 0) {
        input_width_ = rest / scale_;
        return;
      }
    } else if (have == expected) {
      return;
    }
    throw InvalidArgument("export_onnx: layer '" + prefix + "' takes " + std::to_string(expected) +
                          " features but the layer before it gives " +
                          (have >= 0 ? std::to_string(have) : std::string("a width no input gives")) +
                          "; the model cannot run as it is");
  }
  void set_width(std::int64_t width) {
    scale_ = 0;
    shift_ = width;
  }

  void add_initializer(const std::string& name, const Tensor& tensor) {
    const Tensor f32 = tensor.dtype() == DType::kFloat32 ? tensor : tensor.to_dtype(DType::kFloat32, stream_);
    const std::vector<float> values = f32.to_vector<float>(stream_);
    onnx::TensorProto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (std::int64_t d : tensor.shape()) init->add_dims(d);
    // raw_data is little-endian float32, the host's layout on every platform the runtime builds for.
    init->set_raw_data(values.data(), values.size() * sizeof(float));
  }

  std::string scalar_constant(float value) {
    const std::string name = fresh("const");
    onnx::TensorProto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    init->add_float_data(value);
    return name;
  }

  onnx::NodeProto* node(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                        const std::string& output) {
    onnx::NodeProto* n = graph_.add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& input : inputs) n->add_input(input);
    n->add_output(output);
    return n;
  }

  void add_linear(const Linear& linear, const std::string& prefix, std::string& value) {
    require_width(linear.in_features(), prefix);
    std::vector<std::string> inputs = {value, prefix + ".weight"};
    add_initializer(prefix + ".weight", linear.weight());  // [out, in]: Gemm's B transposed
    if (linear.bias().defined()) {
      add_initializer(prefix + ".bias", linear.bias());
      inputs.push_back(prefix + ".bias");
    }
    const std::string out = fresh("linear" + prefix);
    onnx::AttributeProto* trans_b = node("Gemm", "Linear_" + prefix, inputs, out)->add_attribute();
    trans_b->set_name("transB");
    trans_b->set_type(onnx::AttributeProto::INT);
    trans_b->set_i(1);
    value = out;
    set_width(linear.out_features());
  }

  // LayerNormalization (opset 17) over the last axis, with the module's weight and bias as Scale and B.
  void add_layer_norm(const LayerNorm& norm, const std::string& prefix, std::string& value) {
    require_width(norm.normalized_shape(), prefix);
    add_initializer(prefix + ".weight", norm.weight());
    add_initializer(prefix + ".bias", norm.bias());
    const std::string out = fresh("layer_norm" + prefix);
    onnx::NodeProto* n = node("LayerNormalization", "LayerNorm_" + prefix,
                              {value, prefix + ".weight", prefix + ".bias"}, out);
    onnx::AttributeProto* axis = n->add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(-1);
    onnx::AttributeProto* epsilon = n->add_attribute();
    epsilon->set_name("epsilon");
    epsilon->set_type(onnx::AttributeProto::FLOAT);
    epsilon->set_f(static_cast<float>(norm.eps()));
    value = out;
  }

  // Add(body(x), projection(x) or x); both branches start from the same input and must end at one width.
  void add_residual(const ResidualBlock& block, const std::string& prefix, std::string& value) {
    const std::int64_t scale = scale_, shift = shift_;
    std::string body = value;
    add_module(block.body(), join(prefix, "body"), body);
    const std::int64_t body_scale = scale_, body_shift = shift_;
    std::string skip = value;
    scale_ = scale;
    shift_ = shift;
    if (block.projection() != nullptr) add_module(*block.projection(), join(prefix, "projection"), skip);
    const std::int64_t skip_scale = scale_, skip_shift = shift_;
    if (body_scale == 0) {
      require_width(body_shift, prefix);  // the skip's width must be the body's
    } else if (skip_scale == 0) {
      scale_ = body_scale;
      shift_ = body_shift;
      require_width(skip_shift, prefix);
    } else if (body_scale != skip_scale || body_shift != skip_shift) {
      throw InvalidArgument("export_onnx: layer '" + prefix + "': the body and the skip give other widths");
    }
    const std::string out = fresh("residual" + prefix);
    node("Add", "Residual_" + prefix, {body, skip}, out);
    value = out;
  }

  // [x, sin(a_0·x), cos(a_0·x), ...] with the kernels' float constants a_k = float(2^k·π): Mul, Sin, Cos, Concat.
  void add_frequency_encoding(const FrequencyEncoding& encoding, const std::string& prefix, std::string& value) {
    require_width(encoding.in_features(), prefix);
    const std::string name = "FrequencyEncoding_" + (prefix.empty() ? std::string("input") : prefix);
    std::vector<std::string> parts;
    if (encoding.include_input()) parts.push_back(value);
    for (std::int64_t k = 0; k < encoding.num_frequencies(); ++k) {
      const auto a = static_cast<float>(std::ldexp(3.14159265358979323846, static_cast<int>(k)));
      const std::string arg = fresh("frequency_arg"), sin = fresh("frequency_sin"), cos = fresh("frequency_cos");
      node("Mul", name + "_mul" + std::to_string(k), {value, scalar_constant(a)}, arg);
      node("Sin", name + "_sin" + std::to_string(k), {arg}, sin);
      node("Cos", name + "_cos" + std::to_string(k), {arg}, cos);
      parts.insert(parts.end(), {sin, cos});
    }
    value = concat(parts, name);
    set_width(encoding.out_features());
  }

  // Per category column j: Gather the column (axis 1), Cast to int64, Gather the rows of embeddings.j.weight;
  // then Slice the float features and Concat everything. Ids must be in range: ONNX's Gather has no fallback.
  void add_categorical(const CategoricalFeatures& categorical, const std::string& prefix, std::string& value) {
    const std::string name = "CategoricalFeatures_" + (prefix.empty() ? std::string("input") : prefix);
    const auto k = static_cast<std::int64_t>(categorical.cardinalities().size());
    std::vector<std::string> parts;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::string table = join(prefix, "embeddings." + std::to_string(j)) + ".weight";
      add_initializer(table, categorical.embeddings()[static_cast<std::size_t>(j)].state_dict()[0].second);
      const std::string column = fresh("category_column"), ids = fresh("category_ids"), rows = fresh("embedded");
      onnx::NodeProto* pick = node("Gather", name + "_column" + std::to_string(j), {value, int64_constant({j}, {})},
                                   column);
      set_int_attribute(pick, "axis", 1);
      set_int_attribute(node("Cast", name + "_ids" + std::to_string(j), {column}, ids), "to",
                        onnx::TensorProto::INT64);
      set_int_attribute(node("Gather", name + "_embed" + std::to_string(j), {table, ids}, rows), "axis", 0);
      parts.push_back(rows);
    }
    const std::string features = fresh("float_features");
    node("Slice", name + "_features",
         {value, int64_constant({k}, {1}), int64_constant({std::numeric_limits<std::int64_t>::max()}, {1}),
          int64_constant({1}, {1})},
         features);
    parts.push_back(features);
    value = concat(parts, name);
    // [batch, k + f] in, [batch, k·dim + f] out.
    if (scale_ == 0) {
      DDP_CHECK(shift_ >= k, "export_onnx: layer '" + prefix + "' reads " + std::to_string(k) +
                                 " category columns but the layer before it gives " + std::to_string(shift_));
    }
    shift_ += k * categorical.embedding_dim() - k;
  }

  std::string concat(const std::vector<std::string>& parts, const std::string& name) {
    const std::string out = fresh("concat");
    set_int_attribute(node("Concat", name + "_concat", parts, out), "axis", 1);
    return out;
  }

  static void set_int_attribute(onnx::NodeProto* n, const std::string& name, std::int64_t value) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }

  std::string int64_constant(const std::vector<std::int64_t>& values, const std::vector<std::int64_t>& dims) {
    const std::string name = fresh("const");
    onnx::TensorProto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(onnx::TensorProto::INT64);
    for (std::int64_t d : dims) init->add_dims(d);
    for (std::int64_t v : values) init->add_int64_data(v);
    return name;
  }

  void add_activation(Activation act, const std::string& prefix, std::string& value) {
    const std::string out = fresh("act" + prefix);
    switch (act) {
      case Activation::kNone:
        return;
      case Activation::kRelu:
        node("Relu", "ReLU_" + prefix, {value}, out);
        break;
      case Activation::kTanh:
        node("Tanh", "Tanh_" + prefix, {value}, out);
        break;
      case Activation::kSigmoid:
        node("Sigmoid", "Sigmoid_" + prefix, {value}, out);
        break;
      case Activation::kSilu: {  // x · Sigmoid(x), as the kernels compute it
        const std::string sigmoid = fresh("silu_sigmoid");
        node("Sigmoid", "SiLU_" + prefix + "_sigmoid", {value}, sigmoid);
        node("Mul", "SiLU_" + prefix + "_mul", {value, sigmoid}, out);
        break;
      }
      case Activation::kGelu: {
        // 0.5 · x · (1 + erf(x · 1/√2)) with the kernels' float 1/√2; multiplying by 0.5 last rounds the same.
        const std::string scaled = fresh("gelu_scaled"), erf = fresh("gelu_erf"), plus = fresh("gelu_plus"),
                          times = fresh("gelu_times");
        node("Mul", "GELU_" + prefix + "_scale", {value, scalar_constant(0.70710678118654752440f)}, scaled);
        node("Erf", "GELU_" + prefix + "_erf", {scaled}, erf);
        node("Add", "GELU_" + prefix + "_add", {erf, scalar_constant(1.0f)}, plus);
        node("Mul", "GELU_" + prefix + "_mul", {value, plus}, times);
        node("Mul", "GELU_" + prefix + "_half", {times, scalar_constant(0.5f)}, out);
        break;
      }
    }
    value = out;
  }

  onnx::GraphProto& graph_;
  const Stream& stream_;
  int counter_ = 0;
  std::int64_t input_width_ = -1;
  std::int64_t scale_ = 1, shift_ = 0;  // the width so far: scale_·input + shift_
};

void set_float_matrix_type(onnx::ValueInfoProto* info, const std::string& name, std::int64_t width) {
  info->set_name(name);
  onnx::TypeProto_Tensor* type = info->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  type->mutable_shape()->add_dim()->set_dim_param("N");
  type->mutable_shape()->add_dim()->set_dim_value(width);
}

}  // namespace

std::string onnx_model_bytes(const Module& model, const Stream& stream, const OnnxExportOptions& options) {
  onnx::ModelProto proto;
  proto.set_ir_version(onnx::IR_VERSION);
  proto.set_producer_name(options.producer_name);
  proto.set_doc_string(options.doc_string);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);

  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_name(options.graph_name);
  std::string value = "input";
  GraphBuilder builder(*graph, stream, options.input_features);
  builder.add_module(model, "", value);
  if (builder.input_width() < 0 || builder.width() < 0) {
    throw InvalidArgument("export_onnx: no layer of the model says how many features its input has (a Linear, a "
                          "LayerNorm or a FrequencyEncoding would); set OnnxExportOptions::input_features");
  }
  set_float_matrix_type(graph->add_input(), "input", builder.input_width());
  // What flows out of the model is named "output": the last node's output, or an Identity of the input when the
  // model adds no node (Dropout alone) or its last layer adds none.
  if (graph->node_size() > 0 && graph->node(graph->node_size() - 1).output(0) == value) {
    graph->mutable_node(graph->node_size() - 1)->set_output(0, "output");
  } else {
    onnx::NodeProto* identity = graph->add_node();
    identity->set_op_type("Identity");
    identity->set_name("Output");
    identity->add_input(value);
    identity->add_output("output");
  }
  set_float_matrix_type(graph->add_output(), "output", builder.width());

  try {
    onnx::checker::check_model(proto);
  } catch (const std::exception& e) {
    throw InternalError(std::string("export_onnx: ONNX's checker rejected the exported graph (a bug in the "
                                    "exporter, please report it): ") +
                        e.what());
  }
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) throw InternalError("export_onnx: serialising the ONNX model failed");
  return bytes;
}

void export_onnx(const Module& model, const std::string& path, const Stream& stream,
                 const OnnxExportOptions& options) {
  const std::string bytes = onnx_model_bytes(model, stream, options);
  io::write_file_atomically(path, [&](const io::ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

}  // namespace ddp
