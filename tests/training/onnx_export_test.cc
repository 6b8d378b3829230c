// export_onnx: the graph's nodes, initialisers and types read back with ONNX's classes, ONNX's checker on the
// written file, and the errors for what has no ONNX mapping. onnx_checker_test.py and onnx_runtime_test.sh run
// Python's checker and ONNX Runtime on the models onnx_reference writes.
#include "runtime/training/onnx_export.h"

#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/scratch.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

onnx::ModelProto parse(const std::string& bytes) {
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(bytes));
  return model;
}

std::vector<std::string> op_types(const onnx::ModelProto& model) {
  std::vector<std::string> ops;
  for (const auto& node : model.graph().node()) ops.push_back(node.op_type());
  return ops;
}

const onnx::TensorProto* initializer(const onnx::ModelProto& model, const std::string& name) {
  for (const auto& init : model.graph().initializer()) {
    if (init.name() == name) return &init;
  }
  return nullptr;
}

TEST(OnnxExport, AReluMlpBecomesGemmsWithTransposedWeightsAndReluBetweenThem) {
  MLP mlp({4, 8, 3}, Activation::kRelu, 7);
  const onnx::ModelProto model = parse(onnx_model_bytes(mlp, S()));
  EXPECT_EQ(op_types(model), (std::vector<std::string>{"Gemm", "Relu", "Gemm"}));
  ASSERT_EQ(model.opset_import_size(), 1);
  EXPECT_EQ(model.opset_import(0).version(), 17);
  EXPECT_EQ(model.graph().node(0).attribute(0).name(), "transB");
  EXPECT_EQ(model.graph().node(0).attribute(0).i(), 1);
  EXPECT_EQ(model.graph().node(2).output(0), "output");

  ASSERT_EQ(model.graph().input_size(), 1);
  const auto& input = model.graph().input(0);
  EXPECT_EQ(input.name(), "input");
  EXPECT_EQ(input.type().tensor_type().shape().dim(0).dim_param(), "N");
  EXPECT_EQ(input.type().tensor_type().shape().dim(1).dim_value(), 4);
  EXPECT_EQ(model.graph().output(0).name(), "output");
  EXPECT_EQ(model.graph().output(0).type().tensor_type().shape().dim(1).dim_value(), 3);

  // The weights travel bit for bit, under their state-dict names.
  for (const auto& [name, tensor] : mlp.state_dict()) {
    const onnx::TensorProto* init = initializer(model, name);
    ASSERT_NE(init, nullptr) << name;
    EXPECT_EQ(std::vector<std::int64_t>(init->dims().begin(), init->dims().end()), tensor.shape()) << name;
    const std::vector<float> values = tensor.to_vector<float>(S());
    ASSERT_EQ(init->raw_data().size(), values.size() * sizeof(float)) << name;
    EXPECT_EQ(std::memcmp(init->raw_data().data(), values.data(), init->raw_data().size()), 0) << name;
  }
}

TEST(OnnxExport, EachActivationMapsToItsOperatorsAndGeluToItsErfForm) {
  EXPECT_EQ(op_types(parse(onnx_model_bytes(MLP({3, 5, 2}, Activation::kTanh, 1), S()))),
            (std::vector<std::string>{"Gemm", "Tanh", "Gemm"}));
  EXPECT_EQ(op_types(parse(onnx_model_bytes(MLP({3, 5, 2}, Activation::kSigmoid, 1), S()))),
            (std::vector<std::string>{"Gemm", "Sigmoid", "Gemm"}));
  EXPECT_EQ(op_types(parse(onnx_model_bytes(MLP({3, 5, 5, 2}, Activation::kGelu, 1), S()))),
            (std::vector<std::string>{"Gemm", "Mul", "Erf", "Add", "Mul", "Mul", "Gemm", "Mul", "Erf", "Add",
                                      "Mul", "Mul", "Gemm"}));
}

TEST(OnnxExport, TheWrittenFilePassesOnnxsCheckerAndAModelEndingInAnActivationNamesItsOutput) {
  Sequential model;
  model.add(std::make_shared<Linear>(6, 4, true, 3));
  model.add(std::make_shared<ActivationLayer>(Activation::kTanh));
  model.add(std::make_shared<Linear>(4, 1, false, 3, 100));
  model.add(std::make_shared<ActivationLayer>(Activation::kSigmoid));
  const std::string path = testing::fresh_scratch_dir("onnx_export") + "/model.onnx";
  export_onnx(model, path, S(), {.doc_string = "a test model"});
  EXPECT_NO_THROW(onnx::checker::check_model(path));

  std::ifstream in(path, std::ios::binary);
  const onnx::ModelProto read = parse(std::string(std::istreambuf_iterator<char>(in), {}));
  EXPECT_EQ(op_types(read), (std::vector<std::string>{"Gemm", "Tanh", "Gemm", "Sigmoid"}));
  EXPECT_EQ(read.graph().node(2).input_size(), 2) << "a Linear without bias has no C input";
  EXPECT_EQ(read.graph().node(3).output(0), "output");
  EXPECT_EQ(read.doc_string(), "a test model");
  EXPECT_EQ(read.producer_name(), "ddp");
}

class Scale : public Module {
 public:
  Tensor forward(const Tensor& x, const Stream&) override { return x; }
  std::string type_name() const override { return "Scale"; }
};

TEST(OnnxExport, ALayerWithoutAnOnnxMappingIsRefusedByNameAndNoFileIsWritten) {
  Sequential model;
  model.add(std::make_shared<Linear>(3, 3));
  model.add(std::make_shared<Scale>());
  const std::string path = testing::fresh_scratch_dir("onnx_refused") + "/model.onnx";
  try {
    export_onnx(model, path, S());
    FAIL() << "a Scale layer was exported";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("layer '1' is a Scale"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::ifstream(path).good());
}

TEST(OnnxExport, LayersWhoseWidthsDoNotChainAreRefused) {
  Sequential model;
  model.add(std::make_shared<Linear>(3, 4));
  model.add(std::make_shared<Linear>(5, 2));
  EXPECT_THROW(onnx_model_bytes(model, S()), InvalidArgument);
  EXPECT_THROW(onnx_model_bytes(Sequential(), S()), InvalidArgument);
}

TEST(OnnxExport, AMissingDirectoryIsNamedInTheError) {
  const std::string path = testing::scratch_path("no_such_dir_for_onnx") + "/model.onnx";
  try {
    export_onnx(MLP({2, 2}), path, S());
    FAIL() << "wrote into a missing directory";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_dir_for_onnx"), std::string::npos) << e.what();
  }
}

// The MLP family's layers: LayerNormalization with the module's weight and bias, Add for a residual block with
// the body's initialisers under PyTorch's names, and the widths followed through the blocks.
TEST(OnnxExport, AResidualLayerNormModelBecomesLayerNormalizationAndAdd) {
  auto body = std::make_shared<Sequential>();
  body->add(std::make_shared<LayerNorm>(6));
  body->add(std::make_shared<Linear>(6, 6));
  body->add(std::make_shared<ActivationLayer>(Activation::kSilu));
  body->add(std::make_shared<Dropout>(0.2, 1));
  Sequential model;
  model.add(std::make_shared<Linear>(3, 6));
  model.add(std::make_shared<ResidualBlock>(body));
  model.add(std::make_shared<ResidualBlock>(std::make_shared<Linear>(6, 2), std::make_shared<Linear>(6, 2, false)));
  const onnx::ModelProto proto = parse(onnx_model_bytes(model, S()));
  EXPECT_EQ(op_types(proto), (std::vector<std::string>{"Gemm", "LayerNormalization", "Gemm", "Sigmoid", "Mul", "Add",
                                                       "Gemm", "Gemm", "Add"}));
  for (const char* name :
       {"1.body.0.weight", "1.body.0.bias", "1.body.1.weight", "2.body.weight", "2.projection.weight"}) {
    EXPECT_NE(initializer(proto, name), nullptr) << name;
  }
  const auto& norm = proto.graph().node(1);
  ASSERT_EQ(norm.attribute_size(), 2);
  EXPECT_EQ(norm.attribute(0).name(), "axis");
  EXPECT_EQ(norm.attribute(0).i(), -1);
  EXPECT_FLOAT_EQ(norm.attribute(1).f(), 1e-5f);
  EXPECT_EQ(proto.graph().node(8).output(0), "output");
  EXPECT_EQ(proto.graph().input(0).type().tensor_type().shape().dim(1).dim_value(), 3);
  EXPECT_EQ(proto.graph().output(0).type().tensor_type().shape().dim(1).dim_value(), 2);

  Sequential unmatched;
  unmatched.add(std::make_shared<Linear>(3, 6));
  unmatched.add(std::make_shared<ResidualBlock>(std::make_shared<Linear>(6, 4)));
  EXPECT_THROW(onnx_model_bytes(unmatched, S()), InvalidArgument);
}

TEST(OnnxExport, EncodingsAndCategoricalFeaturesTakeTheirInputWidthFromTheLayersAfterThem) {
  Sequential encoded;
  encoded.add(std::make_shared<FrequencyEncoding>(2, 3));
  encoded.add(std::make_shared<Linear>(14, 1));
  const onnx::ModelProto e = parse(onnx_model_bytes(encoded, S()));
  EXPECT_EQ(op_types(e), (std::vector<std::string>{"Mul", "Sin", "Cos", "Mul", "Sin", "Cos", "Mul", "Sin", "Cos",
                                                   "Concat", "Gemm"}));
  EXPECT_EQ(e.graph().input(0).type().tensor_type().shape().dim(1).dim_value(), 2);

  Sequential categorical;
  categorical.add(std::make_shared<CategoricalFeatures>(std::vector<std::int64_t>{4, 3}, 2));
  categorical.add(std::make_shared<Linear>(2 * 2 + 5, 6));
  const onnx::ModelProto c = parse(onnx_model_bytes(categorical, S()));
  EXPECT_EQ(op_types(c), (std::vector<std::string>{"Gather", "Cast", "Gather", "Gather", "Cast", "Gather", "Slice",
                                                   "Concat", "Gemm"}));
  EXPECT_EQ(c.graph().input(0).type().tensor_type().shape().dim(1).dim_value(), 2 + 5);
  EXPECT_NE(initializer(c, "0.embeddings.1.weight"), nullptr);

  // Nothing after the categorical features says how many float features there are: the caller does.
  CategoricalFeatures alone({4}, 3);
  try {
    onnx_model_bytes(alone, S());
    FAIL() << "a model of unknown input width was exported";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("OnnxExportOptions::input_features"), std::string::npos) << e.what();
  }
  const onnx::ModelProto a = parse(onnx_model_bytes(alone, S(), {.input_features = 3}));
  EXPECT_EQ(a.graph().output(0).type().tensor_type().shape().dim(1).dim_value(), 3 + 2);
}

}  // namespace
}  // namespace ddp
