// build_model on the CPU: the layers, state_dict names and widths a description gives, the same model as the
// hand-built MLP for the same seed, the canonical architecture, and each refusal's message (path and key).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/models/layers.h"
#include "runtime/models/model_description.h"
#include "tests/models/residual_model.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

std::vector<std::string> names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.state_dict()) out.push_back(n);
  return out;
}

TEST(ModelDescription, SurrogateIsTheMlpOfTheSameSeed) {
  const DescribedModel d = build_model(
      R"({"inputs": 5, "layers": [{"type": "linear", "out": 64}, {"type": "tanh"}, {"type": "linear", "out": 64},
                                  {"type": "tanh"}, {"type": "linear", "out": 1}]})",
      7, Device::cpu(), S());
  MLP mlp({5, 64, 64, 1}, Activation::kTanh, 7);
  EXPECT_EQ(d.inputs, 5);
  EXPECT_EQ(d.outputs, 1);
  EXPECT_EQ(names(*d.model), names(mlp));
  for (std::size_t i = 0; i < mlp.state_dict().size(); ++i) {
    EXPECT_EQ(d.model->state_dict()[i].second.to_vector<float>(S()), mlp.state_dict()[i].second.to_vector<float>(S()));
  }
  EXPECT_EQ(d.architecture,
            R"({"inputs":5,"layers":[{"type":"linear","in":5,"out":64,"bias":true},{"type":"tanh"},)"
            R"({"type":"linear","in":64,"out":64,"bias":true},{"type":"tanh"},{"type":"linear","in":64,"out":1,"bias":true}]})");
}

TEST(ModelDescription, ResidualModelHasTorchNamesAndTheHandBuiltWeights) {
  const std::string block = R"({"type": "residual", "body": [{"type": "layer_norm"}, {"type": "linear", "out": 32},
                                                             {"type": "gelu"}]})";
  const DescribedModel d = build_model(R"({"inputs": 8, "layers": [{"type": "linear", "out": 32}, )" + block + ", " +
                                           block + R"(, {"type": "linear", "out": 3}]})",
                                       11, Device::cpu(), S());
  const auto hand = test::residual_layer_norm_gelu_model(11, Device::cpu(), S());
  EXPECT_EQ(names(*d.model), names(*hand));
  EXPECT_EQ(names(*d.model)[2], "1.body.0.weight");
  const Tensor x = Tensor::uniform({4, 8}, -1, 1, 3, 0, Device::cpu(), S());
  autograd::NoGradGuard no_grad;
  EXPECT_EQ(d.model->forward(x, S()).to_vector<float>(S()), hand->forward(x, S()).to_vector<float>(S()));
  EXPECT_EQ(d.outputs, 3);
}

TEST(ModelDescription, ProjectionEncodingDropoutAndWidths) {
  const DescribedModel d = build_model(
      R"({"inputs": 2, "layers": [{"type": "frequency_encoding", "frequencies": 3},
          {"type": "residual", "body": [{"type": "linear", "in": 14, "out": 16, "bias": false}, {"type": "silu"}],
           "projection": [{"type": "linear", "out": 16}]},
          {"type": "dropout", "p": 0.1}, {"type": "sigmoid"}, {"type": "layer_norm", "eps": 1e-6},
          {"type": "relu"}, {"type": "linear", "out": 4}]})",
      1, Device::cpu(), S());
  EXPECT_EQ(names(*d.model), (std::vector<std::string>{"1.body.0.weight", "1.projection.0.weight",
                                                       "1.projection.0.bias", "4.weight", "4.bias", "6.weight",
                                                       "6.bias"}));
  EXPECT_EQ(d.outputs, 4);
  EXPECT_EQ((*d.model)[2].type_name(), "Dropout");
  // Spelled differently, the same model: the same architecture.
  const DescribedModel again = build_model(
      R"({"layers": [{"type": "frequency_encoding", "include_input": true, "frequencies": 3},
          {"projection": [{"type": "linear", "out": 16, "bias": true}], "type": "residual",
           "body": [{"type": "linear", "out": 16, "bias": false}, {"type": "silu"}]},
          {"type": "dropout", "p": 0.1}, {"type": "sigmoid"}, {"type": "layer_norm", "eps": 0.000001},
          {"type": "relu"}, {"type": "linear", "out": 4}], "inputs": 2})",
      1, Device::cpu(), S());
  EXPECT_EQ(again.architecture, d.architecture);
  EXPECT_NE(build_model(R"({"inputs": 2, "layers": [{"type": "linear", "out": 4}]})", 1, Device::cpu(), S()).architecture,
            build_model(R"({"inputs": 2, "layers": [{"type": "linear", "out": 4, "bias": false}]})", 1, Device::cpu(), S())
                .architecture);
}

// The message of the refusal of `json`.
std::string refusal(const std::string& json) {
  try {
    build_model(json, 0, Device::cpu(), S());
  } catch (const InvalidArgument& e) {
    return e.user_message();
  }
  return "(accepted)";
}

TEST(ModelDescription, RefusalsNameThePathAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"inputs": 5, "layers": [{"type": "linear", "out": 8}, {"type": "residual", "body": [{"type": "linear", "out": -3}]}]})",
       R"(model description: layers[1].body[0] (linear): key "out" must be a positive integer (at most 16777216), got -3)"},
      {R"({"inputs": 5, "layers": [{"type": "relu6"}]})",
       R"(model description: layers[0]: unknown type "relu6": the types are linear, relu, gelu, tanh, sigmoid, silu, layer_norm, residual, frequency_encoding, dropout)"},
      {R"({"inputs": 5, "layers": [{"type": "linear"}]})",
       R"(model description: layers[0] (linear): key "out" is missing: give the layer's output width, e.g. "out": 64)"},
      {R"({"inputs": 5, "layers": [{"type": "linear", "out": 8}, {"type": "linear", "in": 5, "out": 1}]})",
       R"(model description: layers[1] (linear): key "in" is 5, but the layers before give 8 columns: make it 8 or leave it out)"},
      {R"({"inputs": 5, "layers": [{"type": "linear", "out": 8, "size": 3}]})",
       R"(model description: layers[0] (linear): unknown key "size": a linear takes "out", "in", "bias")"},
      {R"({"inputs": 5, "layers": [{"type": "tanh", "out": 3}]})",
       R"(model description: layers[0] (tanh): unknown key "out": a tanh takes only "type")"},
      {R"({"inputs": 5, "layers": [{"type": "residual", "body": [{"type": "linear", "out": 4}]}]})",
       R"(model description: layers[0] (residual): the body turns 5 columns into 4 and there is no "projection": add one)"},
      {R"({"inputs": 5, "layers": [{"type": "residual", "body": [{"type": "linear", "out": 4}], "projection": [{"type": "linear", "out": 3}]}]})",
       R"(model description: layers[0] (residual): the body gives 4 columns but the projection gives 3)"},
      {R"({"inputs": 5, "layers": [{"type": "dropout", "p": 1}]})",
       R"(model description: layers[0] (dropout): key "p" must be a probability in [0, 1), got 1)"},
      {R"({"inputs": 5, "layers": [{"type": "layer_norm", "eps": "small"}]})",
       R"(model description: layers[0] (layer_norm): key "eps" must be a positive number, got "small")"},
      {R"({"inputs": 5, "layers": [{"type": "linear", "out": 1, "bias": 1}]})",
       R"(key "bias" must be true or false, got 1)"},
      {R"({"inputs": 5, "layers": [{"type": "frequency_encoding", "frequencies": 0, "include_input": false}]})",
       R"(layers[0] (frequency_encoding): no frequencies)"},
      {R"({"inputs": 5, "layers": [{"out": 1}]})", R"(model description: layers[0]: key "type" is missing)"},
      {R"({"inputs": 5, "layers": [3]})", R"(model description: layers[0] must be a JSON object)"},
      {R"({"inputs": 5, "layers": []})", R"(key "layers" must be a non-empty list of layers, got [])"},
      {R"({"layers": [{"type": "relu"}]})", R"(model description: the top level: key "inputs" is missing)"},
      {R"({"inputs": 2.5, "layers": [{"type": "relu"}]})", R"(key "inputs" must be a positive integer (at most 16777216), got 2.5)"},
      {R"({"inputs": 5, "layers": [{"type": "relu"}], "outputs": 3})", R"(model description: unknown key "outputs")"},
      {R"({"inputs": 5, "layers": [{"type": "linear", "out": 1},]})", R"(model description: not valid JSON)"},
      {R"([1, 2])", R"(model description: must be a JSON object)"},
  };
  for (const auto& [json, words] : cases) {
    const std::string message = refusal(json);
    EXPECT_NE(message.find(words), std::string::npos) << json << "\n  gave: " << message << "\n  wanted: " << words;
  }
}

}  // namespace
}  // namespace ddp
