// Weights files on the CPU: a model's weights saved and loaded into another model of the same description, the
// file a plain safetensors state_dict (no checksums needed, as PyTorch writes it), and each refusal (a missing,
// extra or misshapen key, another dtype, a file that is not safetensors) naming the file and the key with the
// model left as it was.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/safetensors.h"
#include "runtime/models/model_description.h"
#include "runtime/training/weights_file.h"
#include "tests/scratch.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

constexpr const char* kResidual =
    R"({"inputs": 3, "layers": [{"type": "linear", "out": 8}, {"type": "residual", "body": [{"type": "layer_norm"},
        {"type": "linear", "out": 8}, {"type": "gelu"}]}, {"type": "linear", "out": 2}]})";

std::vector<std::vector<float>> values(const Module& m) {
  std::vector<std::vector<float>> out;
  for (const auto& [n, t] : m.state_dict()) out.push_back(t.to_vector<float>(S()));
  return out;
}

// The message of what load_weights throws for the file `tensors` make (or `bytes`, when given).
std::string refusal(const std::vector<io::TensorSource>& tensors, const std::string& bytes = "") {
  const std::string path = testing::scratch_path("bad.safetensors");
  if (bytes.empty()) {
    std::ofstream(path, std::ios::binary) << io::encode_safetensors(tensors, {});
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  const DescribedModel d = build_model(kResidual, 1, Device::cpu(), S());
  const auto before = values(*d.model);
  try {
    training::load_weights(*d.model, path, S());
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(values(*d.model), before) << "a refused file changed the model";
    return e.user_message();
  }
  return "(accepted)";
}

TEST(WeightsFile, SavedWeightsLoadIntoAnotherModelOfTheDescription) {
  const DescribedModel a = build_model(kResidual, 1, Device::cpu(), S());
  const DescribedModel b = build_model(kResidual, 2, Device::cpu(), S());
  ASSERT_NE(values(*a.model), values(*b.model));
  const std::string path = testing::scratch_path("weights.safetensors");
  training::save_weights(*a.model, path, S());
  training::load_weights(*b.model, path, S());
  EXPECT_EQ(values(*a.model), values(*b.model));
  // Names and shapes as the model's state_dict; checksums are extra metadata PyTorch ignores.
  const io::SafetensorsFile file = io::load_safetensors(path);
  ASSERT_EQ(file.tensors().size(), a.model->state_dict().size());
  EXPECT_NE(file.find("1.body.0.weight"), nullptr);
  EXPECT_EQ(file.at("2.weight").shape, (std::vector<std::int64_t>{2, 8}));
}

TEST(WeightsFile, RefusalsNameTheFileAndTheKey) {
  const DescribedModel d = build_model(kResidual, 1, Device::cpu(), S());
  std::vector<io::TensorSource> good;
  std::vector<std::vector<float>> storage;
  for (const auto& [name, t] : d.model->state_dict()) {
    storage.push_back(t.to_vector<float>(S()));
    good.push_back({name, DType::kFloat32, t.shape(), storage.back().data(), storage.back().size() * 4, nullptr});
  }
  EXPECT_EQ(refusal(good), "(accepted)");

  std::vector<io::TensorSource> missing(good.begin(), good.end() - 1);
  EXPECT_NE(refusal(missing).find("the model's 2.bias [2] is missing from the file"), std::string::npos)
      << refusal(missing);

  std::vector<io::TensorSource> extra = good;
  const float one = 1;
  extra.push_back({"3.weight", DType::kFloat32, {1}, &one, 4, nullptr});
  EXPECT_NE(refusal(extra).find("holds 3.weight, which the model does not have"), std::string::npos) << refusal(extra);

  std::vector<io::TensorSource> misshapen = good;
  misshapen[0].shape = {3, 8};
  EXPECT_NE(refusal(misshapen).find("0.weight has shape [3, 8] but the model's is [8, 3]"), std::string::npos)
      << refusal(misshapen);

  std::vector<io::TensorSource> doubles = good;
  std::vector<double> wide(storage[1].begin(), storage[1].end());
  doubles[1] = {"0.bias", DType::kFloat64, {8}, wide.data(), wide.size() * 8, nullptr};
  EXPECT_NE(refusal(doubles).find("0.bias is F64, the model's is F32"), std::string::npos) << refusal(doubles);

  const std::string garbage = refusal({}, "this is not a safetensors file at all");
  EXPECT_NE(garbage.find("weights file " + testing::scratch_path("bad.safetensors") + ": "), std::string::npos)
      << garbage;
}

}  // namespace
}  // namespace ddp
