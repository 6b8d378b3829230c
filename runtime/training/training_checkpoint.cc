// Model and optimizer onto checkpoint tensors and back. Each tensor's bytes are produced while the file is
// written (copied from the device, or gathered from the ranks' shards), one tensor at a time.
#include "runtime/training/training_checkpoint.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/check.h"
#include "runtime/io/loaded_checkpoint.h"
#include "runtime/training/weights_file.h"

namespace ddp::training {
namespace {

// Where the optimizer keeps state for the flat range [slot.offset, +numel): each piece of the range it holds,
// with that piece's position in its packed state buffers.
struct StatePiece {
  FlatSpan flat;
  std::int64_t state_offset;
};

std::vector<StatePiece> state_pieces(const Optimizer& optimizer, FlatSpan range) {
  std::vector<StatePiece> out;
  std::int64_t state_offset = 0;
  for (const FlatSpan& span : optimizer.state_spans()) {
    for (const FlatSpan& piece : intersect({span}, range)) {
      out.push_back({piece, state_offset + (piece.offset - span.offset)});
    }
    state_offset += span.count;
  }
  return out;
}

// This rank's part of `range` of one state buffer, in flat order, in host memory.
std::vector<float> local_state(const Optimizer& optimizer, const Tensor& state, FlatSpan range, const Stream& stream) {
  std::vector<float> out;
  for (const StatePiece& p : state_pieces(optimizer, range)) {
    const std::vector<float> v = state.flat_slice(p.state_offset, {p.flat.count}).to_vector<float>(stream);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The collective side of a sharded save: every rank takes part in one gather per optimizer tensor, in file
// order, and then in one vote on whether every rank got through. Rank 0 runs the gathers from inside the file
// write (a tensor is gathered when the writer asks for its bytes) and votes after the last one, before the
// file is committed, so that no file is renamed into place without every rank's shard in it. If rank 0's write
// fails, it still runs the remaining gathers and votes, so that no rank is left waiting.
class StateGather {
 public:
  StateGather(const Optimizer& optimizer, const Stream& stream) : optimizer_(optimizer), stream_(stream) {
    for (const auto& [name, state] : optimizer.state()) {
      for (const ParameterSlot& slot : optimizer.store().slots()) items_.push_back({state, {slot.offset, slot.numel}});
    }
  }

  bool all_gathered() const { return next_ == items_.size(); }

  // The next tensor, `range` of the flat state (on rank 0 into `out`). A local failure is kept for the vote and
  // the gathers go on with zeros, so that the other ranks are not left waiting.
  void gather_next(FlatSpan range, float* out) {
    DDP_ASSERT(next_ < items_.size() && items_[next_].range.offset == range.offset &&
                   items_[next_].range.count == range.count,
               "a sharded checkpoint asked for its tensors in another order than every rank gathers them in");
    const Item& item = items_[next_++];
    std::vector<float> local;
    if (!failure_) {
      try {
        local = local_state(optimizer_, item.state, item.range, stream_);
      } catch (...) {
        failure_ = std::current_exception();
      }
    }
    if (failure_) {
      std::int64_t count = 0;
      for (const StatePiece& p : state_pieces(optimizer_, item.range)) count += p.flat.count;
      local.assign(static_cast<std::size_t>(count), 0.0f);
    }
    optimizer_.shard()->gather_to_first(item.range, local.data(), out);
  }

  // Whether every rank got through, each saying so (once); rethrows this rank's own failure.
  bool vote(bool failed_here) {
    DDP_ASSERT(!voted_, "a checkpoint vote taken twice");
    voted_ = true;
    const double failed = optimizer_.shard()->sum(failed_here || failure_ ? 1.0 : 0.0);
    if (failure_) std::rethrow_exception(failure_);
    return failed == 0.0;
  }

  // The remaining gathers (their data unused), then the vote if it has not been taken.
  void finish(bool failed_here) {
    std::vector<float> discard;
    while (!all_gathered()) {
      discard.resize(static_cast<std::size_t>(items_[next_].range.count));
      gather_next(items_[next_].range, discard.data());
    }
    if (!voted_) vote(failed_here);
  }

 private:
  struct Item {
    Tensor state;
    FlatSpan range;
  };
  const Optimizer& optimizer_;
  const Stream& stream_;
  std::vector<Item> items_;
  std::size_t next_ = 0;
  bool voted_ = false;
  std::exception_ptr failure_;
};

std::vector<io::TensorSource> model_tensors(const Module& model, const Stream& stream) {
  std::vector<io::TensorSource> out = parameter_tensors(model, stream);
  // Buffers (Dropout's draw counter) in their own type, so a resumed run continues their state bit for bit.
  for (const auto& [name, t] : model.named_buffers()) {
    const Tensor tensor = t;
    out.push_back({buffer_tensor_name(name), t.dtype(), t.shape(), nullptr, t.nbytes(),
                   [tensor, &stream](const io::ByteSink& sink) {
                     const Tensor host = tensor.copy_to(Device::cpu(), stream);
                     stream.synchronize();  // a copy from a device lands when the stream has done it
                     sink(host.data_ptr(), host.nbytes());
                   }});
  }
  return out;
}

}  // namespace

std::string buffer_tensor_name(const std::string& buffer) { return kBufferPrefix + buffer; }

std::string save_training_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                                     const io::CheckpointMetadata& metadata, const Stream& stream, int keep_last) {
  std::unique_ptr<StateGather> gather;
  if (optimizer.sharded()) gather = std::make_unique<StateGather>(optimizer, stream);
  if (gather && optimizer.shard()->rank() != 0) {
    gather->finish(false);
    return "";
  }

  io::CheckpointMetadata meta = metadata;
  meta.extra["optimizer.steps"] = std::to_string(optimizer.steps());
  std::vector<io::TensorSource> tensors = model_tensors(model, stream);
  for (const auto& [state_name, state] : optimizer.state()) {
    for (const ParameterSlot& slot : optimizer.store().slots()) {
      const FlatSpan range{slot.offset, slot.numel};
      const Tensor buffer = state;
      auto produce = [&, buffer, range](const io::ByteSink& sink) {
        std::vector<float> values(static_cast<std::size_t>(range.count));
        if (!gather) {
          values = local_state(optimizer, buffer, range, stream);
        } else {
          gather->gather_next(range, values.data());  // the writer asks in StateGather's order: states, then slots
          if (gather->all_gathered() && !gather->vote(false)) {
            throw Error("checkpoint not written: another rank could not contribute its shard of the optimizer state");
          }
        }
        sink(values.data(), values.size() * 4);
      };
      tensors.push_back({io::optimizer_tensor_name(state_name, slot.name), DType::kFloat32, slot.shape, nullptr,
                         static_cast<std::size_t>(slot.numel) * 4, produce});
    }
  }
  if (!gather) return io::save_checkpoint(dir, meta, tensors, keep_last);
  std::string path;
  try {
    path = io::save_checkpoint(dir, meta, tensors, keep_last);
  } catch (...) {
    gather->finish(/*failed_here=*/true);  // the other ranks' remaining gathers and vote
    throw;
  }
  gather->finish(false);  // the vote, when there was nothing to gather
  return path;
}

// The optimizer step count a checkpoint holds ("optimizer.steps"), or nullopt with `why` set.
std::optional<std::int64_t> checkpoint_optimizer_steps(const io::CheckpointMetadata& metadata, std::string* why) {
  const auto steps = metadata.extra.find("optimizer.steps");
  if (steps == metadata.extra.end()) {
    *why = "no optimizer.steps in the metadata: not a training checkpoint of this runtime";
    return std::nullopt;
  }
  const std::string& text = steps->second;
  const bool digits = !text.empty() && text.size() <= 18 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    *why = "metadata optimizer.steps = '" + text + "' is not a non-negative integer";
    return std::nullopt;
  }
  return std::stoll(text);
}

std::string metadata_out_of_range(const io::CheckpointContents& checkpoint, std::int64_t dataset_size) {
  const io::CheckpointMetadata& m = checkpoint.metadata;
  if (dataset_size >= 0 && m.sampler_position > dataset_size) {
    return "metadata ddp.sampler_position = " + std::to_string(m.sampler_position) + " is past the end of the " +
           "data set of " + std::to_string(dataset_size) +
           " samples: the checkpoint is damaged, or of another data set";
  }
  std::string why;
  if (!checkpoint_optimizer_steps(m, &why)) return why;
  return "";
}

namespace {

// restore_training_checkpoint from a file loaded and verified already.
void restore_from(const io::LoadedCheckpoint& checkpoint, Module& model, Optimizer& optimizer, const Stream& stream) {
  const io::SafetensorsFile& file = checkpoint.file;
  // Every tensor of the file must be one of ours: a deeper model's checkpoint has the shallower one's tensors
  // with the same shapes, and more.
  std::set<std::string> expected;
  for (const auto& [name, t] : model.state_dict()) expected.insert(name);
  for (const auto& [name, t] : model.named_buffers()) expected.insert(buffer_tensor_name(name));
  for (const auto& [state, packed] : optimizer.state()) {
    for (const ParameterSlot& slot : optimizer.store().slots()) {
      expected.insert(io::optimizer_tensor_name(state, slot.name));
    }
  }
  std::vector<std::string> extra;
  for (const io::TensorEntry& t : file.tensors()) {
    if (expected.count(t.name) == 0) extra.push_back(t.name);
  }
  if (!extra.empty()) {
    std::string names;
    for (std::size_t i = 0; i < extra.size() && i < 8; ++i) names += (i ? ", " : "") + extra[i];
    if (extra.size() > 8) names += ", ... (" + std::to_string(extra.size()) + " in all)";
    throw InvalidArgument(file.where() + "holds tensors this model and optimizer do not have: " + names +
                          "; it was written by another model (more layers?) or optimizer: resume with the same "
                          "model and optimizer, or start a new run in another checkpoint directory");
  }
  for (const auto& [name, t] : model.state_dict()) {
    std::vector<float> values(static_cast<std::size_t>(t.numel()));
    file.copy_to(name, DType::kFloat32, t.shape(), values.data());
    Tensor(t).copy_from(Tensor::from_vector(values, t.shape(), Device::cpu(), stream), stream);
  }
  // A checkpoint written before the model had buffers (or by a model without them) leaves them as they are.
  for (const auto& [name, t] : model.named_buffers()) {
    const std::string key = buffer_tensor_name(name);
    if (file.find(key) == nullptr) continue;
    std::vector<std::uint8_t> bytes(t.nbytes());
    file.copy_to(key, t.dtype(), t.shape(), bytes.data());
    Tensor(t).copy_from(Tensor::from_host(bytes.data(), t.shape(), t.dtype(), Device::cpu(), stream), stream);
  }
  // Every tensor is read and checked on every rank (the same refusal everywhere); each rank keeps the parts
  // its state buffers cover (all of them unsharded).
  const ParameterStore& store = optimizer.store();
  for (const auto& [state, packed] : optimizer.state()) {
    std::vector<float> local(static_cast<std::size_t>(packed.numel()));
    std::vector<float> values;
    for (const ParameterSlot& slot : store.slots()) {
      values.resize(static_cast<std::size_t>(slot.numel));
      file.copy_to(io::optimizer_tensor_name(state, slot.name), DType::kFloat32, slot.shape, values.data());
      for (const StatePiece& p : state_pieces(optimizer, {slot.offset, slot.numel})) {
        std::copy_n(values.begin() + (p.flat.offset - slot.offset), p.flat.count, local.begin() + p.state_offset);
      }
    }
    Tensor(packed).copy_from(Tensor::from_vector(local, packed.shape(), Device::cpu(), stream), stream);
  }
  std::string why;
  const std::optional<std::int64_t> steps = checkpoint_optimizer_steps(checkpoint.metadata, &why);
  if (!steps) throw InvalidArgument(file.where() + why);
  optimizer.set_steps(*steps);
  stream.synchronize();
}

}  // namespace

void restore_training_checkpoint(const std::string& path, Module& model, Optimizer& optimizer, const Stream& stream) {
  restore_from(io::load_checkpoint(path), model, optimizer, stream);
}

std::string save_training_checkpoint(Session& session, const std::string& dir, const Module& model,
                                     const Optimizer& optimizer, const io::CheckpointMetadata& metadata,
                                     int keep_last) {
  std::string path;
  std::string error;
  if (session.is_lead() || optimizer.sharded()) {  // sharded, every rank sends its part of the state to rank 0
    try {
      io::CheckpointMetadata m = metadata;
      m.world_size = session.size();
      path = save_training_checkpoint(dir, model, optimizer, m, session.stream(), keep_last);
    } catch (const Error& e) {  // what the user can act on, without the runtime's source locations
      error = e.user_message();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  session.agree(error, "checkpoint write failed");
  return session.is_lead() ? path : dir + "/" + io::checkpoint_file_name(metadata.step);
}

std::optional<RestoredCheckpoint> restore_latest_training_checkpoint(Session& session, const std::string& dir,
                                                                     Module& model, Optimizer& optimizer,
                                                                     const io::CheckpointCheck& refuse,
                                                                     std::int64_t dataset_size) {
  std::optional<io::LoadedCheckpoint> checkpoint;
  std::string error;
  try {
    checkpoint = io::latest_complete_checkpoint(dir, io::warn_to_stderr, [&](const io::CheckpointContents& c) {
      return metadata_out_of_range(c, dataset_size);
    });
    if (checkpoint && refuse) error = refuse(checkpoint->contents());
    if (checkpoint && error.empty()) restore_from(*checkpoint, model, optimizer, session.stream());
  } catch (const Error& e) {
    error = e.user_message();
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
