// Weights files: the model's state_dict onto safetensors and back, checked against the model before anything
// is copied so that a refused file leaves the model as it was.
#include "runtime/training/weights_file.h"

#include <optional>
#include <set>

#include "runtime/core/check.h"
#include "runtime/io/safetensors.h"

namespace ddp::training {
namespace {

// The file at `path`, read and checked against the model's state_dict: every key present, float32, the same
// shape, and no key the model lacks.
io::SafetensorsFile checked_weights(const Module& model, const std::string& path) {
  io::ReadOptions options;
  options.kind = "weights file";
  const io::SafetensorsFile file = io::load_safetensors(path, options);
  const std::string how = ": load weights saved from a model built as this one (the same description)";
  std::set<std::string> keys;
  for (const auto& [name, t] : model.state_dict()) {
    keys.insert(name);
    const io::TensorEntry* entry = file.find(name);
    if (entry == nullptr) {
      throw InvalidArgument(file.where() + "the model's " + name + " " + shape_str(t.shape()) +
                            " is missing from the file" + how);
    }
    if (entry->dtype != DType::kFloat32) {
      throw InvalidArgument(file.where() + name + " is " + safetensors_dtype_name(entry->dtype) +
                            ", the model's is F32: save the PyTorch model's state_dict in float32 (model.float())");
    }
    if (entry->shape != t.shape()) {
      throw InvalidArgument(file.where() + name + " has shape " + shape_str(entry->shape) + " but the model's is " +
                            shape_str(t.shape()) + how);
    }
  }
  for (const io::TensorEntry& entry : file.tensors()) {
    if (keys.count(entry.name) == 0) {
      throw InvalidArgument(file.where() + "holds " + entry.name + ", which the model does not have" + how);
    }
  }
  return file;
}

void copy_weights(const io::SafetensorsFile& file, Module& model, const Stream& stream) {
  for (const auto& [name, t] : model.state_dict()) {
    std::vector<float> values(static_cast<std::size_t>(t.numel()));
    file.copy_to(name, DType::kFloat32, t.shape(), values.data());
    Tensor(t).copy_from(Tensor::from_vector(values, t.shape(), Device::cpu(), stream), stream);
  }
  stream.synchronize();
}

// What went wrong, for session.agree: the user's half of a runtime error.
template <typename Body>
std::string attempt(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.user_message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::vector<io::TensorSource> parameter_tensors(const Module& model, const Stream& stream) {
  std::vector<io::TensorSource> out;
  for (const auto& [name, t] : model.state_dict()) {
    DDP_CHECK(t.dtype() == DType::kFloat32, "weights: parameter " + name + " is not float32");
    const Tensor tensor = t;
    out.push_back({name, DType::kFloat32, t.shape(), nullptr, static_cast<std::size_t>(t.numel()) * 4,
                   [tensor, &stream](const io::ByteSink& sink) {
                     const std::vector<float> v = tensor.to_vector<float>(stream);
                     sink(v.data(), v.size() * 4);
                   }});
  }
  return out;
}

void load_weights(Module& model, const std::string& path, const Stream& stream) {
  copy_weights(checked_weights(model, path), model, stream);
}

void save_weights(const Module& model, const std::string& path, const Stream& stream) {
  io::save_safetensors(path, parameter_tensors(model, stream), {});
}

void load_weights(Session& session, Module& model, const std::string& path) {
  std::optional<io::SafetensorsFile> file;
  session.agree(attempt([&] { file = checked_weights(model, path); }), "weights not loaded");
  copy_weights(*file, model, session.stream());
}

void save_weights(Session& session, const Module& model, const std::string& path) {
  std::string error;
  if (session.is_lead()) error = attempt([&] { save_weights(model, path, session.stream()); });
  session.agree(error, "weights not saved");
}

}  // namespace ddp::training
