// Writes the models ONNX's checker (onnx_checker_test.py) and ONNX Runtime (onnx_runtime_test.sh) are run on,
// with the runtime's own outputs for them: for each case NAME, DIR/NAME.onnx and DIR/NAME.json holding
// {"input": [...], "input_shape": [N, F], "output": [...], "output_shape": [N, O]} (row-major float32 values,
// written with enough digits to read back exactly). With `cuda` the models live, and their outputs are computed,
// on the GPU (tests/gpu/onnx_runtime_check.py compares those on the GPU machine).
//
//   onnx_reference DIR [cpu|cuda]
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/models/layers.h"
#include "runtime/training/onnx_export.h"
#include "tests/models/residual_model.h"

namespace {

using ddp::Activation;

// The device the models are built and run on, and its stream.
ddp::Device g_device = ddp::Device::cpu();
const ddp::Stream& S() {
  static const ddp::Stream stream = g_device.is_cuda() ? ddp::Stream::create(g_device) : ddp::Stream();
  return g_device.is_cuda() ? stream : ddp::cpu_stream();
}

// The model in eval mode (Dropout the identity, as the exported graph) on `x`.
void write_case(const std::string& dir, const std::string& name, ddp::Module& model, const ddp::Tensor& x) {
  model.eval();
  ddp::export_onnx(model, dir + "/" + name + ".onnx", S(), {.doc_string = name, .input_features = x.size(1)});
  ddp::autograd::NoGradGuard no_grad;
  const ddp::Tensor y = model.forward(x, S());
  const nlohmann::json record = {{"input", x.to_vector<float>(S())},
                                 {"input_shape", x.shape()},
                                 {"output", y.to_vector<float>(S())},
                                 {"output_shape", y.shape()}};
  std::ofstream(dir + "/" + name + ".json") << record.dump() << "\n";
  std::printf("%s/%s.onnx\n", dir.c_str(), name.c_str());
}

void write_case(const std::string& dir, const std::string& name, ddp::Module& model, std::int64_t rows,
                std::int64_t features) {
  // Inputs of a spread a normalised data set has, with a few large ones where the activations saturate.
  write_case(dir, name, model, ddp::Tensor::normal({rows, features}, 0.0f, 1.5f, 1234, 0, g_device, S()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "cpu" && std::string(argv[2]) != "cuda")) {
    std::fprintf(stderr, "usage: %s DIR [cpu|cuda] (DIR: an existing directory the models and outputs go to)\n",
                 argv[0]);
    return 2;
  }
  if (argc == 3 && std::string(argv[2]) == "cuda") g_device = ddp::Device::cuda(0);
  const std::string dir = argv[1];
  const std::vector<std::pair<std::string, Activation>> activations = {
      {"relu", Activation::kRelu}, {"gelu", Activation::kGelu}, {"tanh", Activation::kTanh},
      {"sigmoid", Activation::kSigmoid}};
  for (const auto& [name, act] : activations) {
    ddp::MLP model({6, 16, 12, 4}, act, 11, g_device, S());
    write_case(dir, "mlp_" + name, model, 64, 6);
  }
  // The main job's shape: Fashion-MNIST's 784 features, hidden widths 256 and 128, 10 classes.
  ddp::MLP wide({784, 256, 128, 10}, Activation::kRelu, 3, g_device, S());
  write_case(dir, "mlp_784_256_128_10", wide, 32, 784);
  // A regression stack ending in an activation, one Linear without bias.
  ddp::Sequential regression;
  regression.add(std::make_shared<ddp::Linear>(5, 8, true, 5, 0, g_device, S()));
  regression.add(std::make_shared<ddp::ActivationLayer>(Activation::kTanh));
  regression.add(std::make_shared<ddp::Linear>(8, 2, false, 5, 1000, g_device, S()));
  regression.add(std::make_shared<ddp::ActivationLayer>(Activation::kSigmoid));
  write_case(dir, "regression_tanh_sigmoid", regression, 16, 5);
  // The MLP family: a residual LayerNorm GELU model, a frequency encoding into SiLU and Dropout, categorical ids.
  auto residual = ddp::test::residual_layer_norm_gelu_model(7, g_device, S());
  write_case(dir, "residual_layer_norm_gelu", *residual, 32, 8);
  ddp::Sequential encoded;
  encoded.add(std::make_shared<ddp::FrequencyEncoding>(3, 4));
  encoded.add(std::make_shared<ddp::Linear>(27, 16, true, 8, 0, g_device, S()));
  encoded.add(std::make_shared<ddp::ActivationLayer>(Activation::kSilu));
  encoded.add(std::make_shared<ddp::Dropout>(0.3, 2, g_device, S()));
  encoded.add(std::make_shared<ddp::Linear>(16, 2, true, 8, 1000, g_device, S()));
  write_case(dir, "frequency_encoding_silu_dropout", encoded, 24, 3);
  ddp::Sequential categorical;
  categorical.add(std::make_shared<ddp::CategoricalFeatures>(std::vector<std::int64_t>{5, 3}, 4, 9, g_device, S()));
  categorical.add(std::make_shared<ddp::Linear>(4 * 2 + 2, 3, true, 9, 1000, g_device, S()));
  std::vector<float> rows;
  for (int r = 0; r < 20; ++r) {
    rows.insert(rows.end(), {static_cast<float>(r % 5), static_cast<float>((r * 2) % 3), 0.1f * static_cast<float>(r),
                             -0.05f * static_cast<float>(r * r % 7)});
  }
  write_case(dir, "categorical_features", categorical, ddp::Tensor::from_vector(rows, {20, 4}, g_device, S()));
  return 0;
}
