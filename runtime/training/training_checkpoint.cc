#include "runtime/training/training_checkpoint.h"

#include <exception>
#include <vector>

#include "runtime/core/check.h"

namespace ddp::training {
namespace {

struct HostTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// Per-parameter slices of the optimizer's flat state buffers, named "optimizer.<state>.<param>".
std::vector<HostTensor> optimizer_tensors(const Optimizer& optimizer, const Stream& stream) {
  std::vector<HostTensor> out;
  const ParameterStore& store = optimizer.store();
  for (const auto& [state, flat] : optimizer.state()) {
    const std::vector<float> all = flat.to_vector<float>(stream);
    for (const ParameterSlot& slot : store.slots()) {
      HostTensor t{io::optimizer_tensor_name(state, slot.name), slot.shape, {}};
      t.values.assign(all.begin() + slot.offset, all.begin() + slot.offset + slot.numel);
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace

std::string save_training_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                                     const io::CheckpointMetadata& metadata, const Stream& stream, int keep_last) {
  std::vector<HostTensor> tensors;
  for (const auto& [name, t] : model.state_dict()) {
    DDP_CHECK(t.dtype() == DType::kFloat32, "checkpoint: parameter " + name + " is not float32");
    tensors.push_back(HostTensor{name, t.shape(), t.to_vector<float>(stream)});
  }
  for (HostTensor& t : optimizer_tensors(optimizer, stream)) tensors.push_back(std::move(t));
  io::CheckpointMetadata meta = metadata;
  meta.extra["optimizer.steps"] = std::to_string(optimizer.steps());
  std::vector<io::TensorSource> sources;
  sources.reserve(tensors.size());
  for (const HostTensor& t : tensors) {
    sources.push_back(io::TensorSource{t.name, DType::kFloat32, t.shape, t.values.data(), t.values.size() * 4});
  }
  return io::save_checkpoint(dir, meta, sources, keep_last);
}

void restore_training_checkpoint(const io::LoadedCheckpoint& checkpoint, Module& model, Optimizer& optimizer,
                                 const Stream& stream) {
  const io::SafetensorsFile& file = checkpoint.file;
  for (const auto& [name, t] : model.state_dict()) {
    std::vector<float> values(static_cast<std::size_t>(t.numel()));
    file.copy_to(name, DType::kFloat32, t.shape(), values.data());
    Tensor(t).copy_from(Tensor::from_vector(values, t.shape(), Device::cpu(), stream), stream);
  }
  const ParameterStore& store = optimizer.store();
  for (const auto& [state, flat] : optimizer.state()) {
    std::vector<float> all(static_cast<std::size_t>(flat.numel()));
    for (const ParameterSlot& slot : store.slots()) {
      file.copy_to(io::optimizer_tensor_name(state, slot.name), DType::kFloat32, slot.shape,
                   all.data() + slot.offset);
    }
    Tensor(flat).copy_from(Tensor::from_vector(all, flat.shape(), Device::cpu(), stream), stream);
  }
  auto steps = checkpoint.metadata.extra.find("optimizer.steps");
  if (steps == checkpoint.metadata.extra.end()) {
    throw InvalidArgument(file.where() + "no optimizer.steps in the metadata: not a training checkpoint of this runtime");
  }
  optimizer.set_steps(std::stoll(steps->second));
  stream.synchronize();
}

std::string save_training_checkpoint(Session& session, const std::string& dir, const Module& model,
                                     const Optimizer& optimizer, const io::CheckpointMetadata& metadata,
                                     int keep_last) {
  std::string path;
  std::string error;
  if (session.is_lead()) {
    try {
      io::CheckpointMetadata m = metadata;
      m.world_size = session.size();
      path = save_training_checkpoint(dir, model, optimizer, m, session.stream(), keep_last);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  session.agree(error, "checkpoint write failed");
  return session.is_lead() ? path : dir + "/" + io::checkpoint_file_name(metadata.step);
}

std::optional<RestoredCheckpoint> restore_latest_training_checkpoint(Session& session, const std::string& dir,
                                                                     Module& model, Optimizer& optimizer,
                                                                     const CheckpointRefusal& refuse) {
  std::optional<io::LoadedCheckpoint> checkpoint;
  std::string error;
  try {
    checkpoint = io::latest_complete_checkpoint(dir);
    if (checkpoint && refuse) error = refuse(*checkpoint);
    if (checkpoint && error.empty()) restore_training_checkpoint(*checkpoint, model, optimizer, session.stream());
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank makes the same choice: one starting from scratch while another resumes would train two models.
  const bool found = checkpoint.has_value();
  const bool found_somewhere = session.any(found);  // both collectives on every rank, errors or not
  const bool missing_somewhere = session.any(!found);
  if (error.empty() && found_somewhere && missing_somewhere) {
    error = (found ? checkpoint->path + " exists here but not on every rank"
                   : "no complete checkpoint in " + dir + " here, but another rank has one") +
            "; is the checkpoint directory shared by all nodes?";
  }
  session.agree(error, "cannot resume");
  if (!found) return std::nullopt;
  return RestoredCheckpoint{checkpoint->path, checkpoint->metadata};
}

}  // namespace ddp::training
