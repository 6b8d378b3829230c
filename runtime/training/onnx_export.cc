// The MLP as an ONNX graph, built with ONNX's own protobuf classes and checked by ONNX's checker.
#include "runtime/training/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"

namespace ddp {
namespace {

// Opset 17 is the newest ONNX 1.12 (Debian 12's libonnx) checks; every operator used here exists since 13-14.
constexpr std::int64_t kOpset = 17;

// Walks a Sequential and appends its layers' nodes; `value` is the name of the tensor flowing through.
class GraphBuilder {
 public:
  GraphBuilder(onnx::GraphProto& graph, const Stream& stream) : graph_(graph), stream_(stream) {}

  void add_module(const Module& module, const std::string& prefix, std::string& value, std::int64_t& width) {
    if (const auto* seq = dynamic_cast<const Sequential*>(&module)) {
      for (const auto& [name, child] : seq->children()) {
        add_module(*child, prefix.empty() ? name : prefix + "." + name, value, width);
      }
    } else if (const auto* linear = dynamic_cast<const Linear*>(&module)) {
      add_linear(*linear, prefix, value, width);
    } else if (const auto* act = dynamic_cast<const ActivationLayer*>(&module)) {
      add_activation(act->activation(), prefix, value);
    } else {
      throw InvalidArgument("export_onnx: layer '" + prefix + "' is a " + module.type_name() +
                            ", which has no ONNX mapping; export_onnx takes Sequentials of Linear and activation "
                            "layers (an MLP)");
    }
  }

  // The first Linear's in_features: the model's input width.
  std::int64_t input_width() const { return input_width_; }

 private:
  std::string fresh(const std::string& base) { return base + "_" + std::to_string(counter_++); }

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

  void add_linear(const Linear& linear, const std::string& prefix, std::string& value, std::int64_t& width) {
    if (width >= 0 && width != linear.in_features()) {
      throw InvalidArgument("export_onnx: layer '" + prefix + "' takes " + std::to_string(linear.in_features()) +
                            " features but the layer before it gives " + std::to_string(width) +
                            "; the model cannot run as it is");
    }
    if (width < 0) input_width_ = linear.in_features();
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
    width = linear.out_features();
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
};

void set_float_matrix_type(onnx::ValueInfoProto* info, const std::string& name, std::int64_t width) {
  info->set_name(name);
  onnx::TypeProto_Tensor* type = info->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  type->mutable_shape()->add_dim()->set_dim_param("N");
  type->mutable_shape()->add_dim()->set_dim_value(width);
}

}  // namespace

std::string onnx_model_bytes(const Sequential& model, const Stream& stream, const OnnxExportOptions& options) {
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
  std::int64_t width = -1;
  GraphBuilder builder(*graph, stream);
  builder.add_module(model, "", value, width);
  if (width < 0) {
    throw InvalidArgument("export_onnx: the model has no Linear layer, so its input width is unknown; export a "
                          "Sequential that starts with a Linear (an MLP)");
  }
  set_float_matrix_type(graph->add_input(), "input", builder.input_width());
  // The last node, whose output is what flows out of the model, writes "output".
  graph->mutable_node(graph->node_size() - 1)->set_output(0, "output");
  set_float_matrix_type(graph->add_output(), "output", width);

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

void export_onnx(const Sequential& model, const std::string& path, const Stream& stream,
                 const OnnxExportOptions& options) {
  const std::string bytes = onnx_model_bytes(model, stream, options);
  io::write_file_atomically(path, [&](const io::ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

}  // namespace ddp
