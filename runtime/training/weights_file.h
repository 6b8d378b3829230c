// A model's weights alone as a safetensors file with PyTorch's state_dict names: what
// safetensors.torch.save_file(model.state_dict(), path) writes and what model.load_state_dict(load_file(path))
// reads. It exists so that a model trained offline in PyTorch can be fine-tuned here and handed back; a training
// checkpoint (training_checkpoint.h) also holds the optimizer's state and where the run stands.
#pragma once

#include <string>
#include <vector>

#include "runtime/distributed/session.h"
#include "runtime/models/module.h"

namespace ddp::io {
struct TensorSource;  // runtime/io/safetensors.h, kept out of the public header
}  // namespace ddp::io

namespace ddp::training {

// The model's parameters as tensors to write, by state_dict name, each copied from its device on `stream` while
// the file is written.
std::vector<io::TensorSource> parameter_tensors(const Module& model, const Stream& stream);

// Loads every parameter of `model` from the safetensors file at `path`. The file must hold exactly the model's
// state_dict keys, each float32 of the parameter's shape; the first missing key, wrong dtype or shape, or extra
// key is an InvalidArgument naming the file and the key, and nothing is loaded then. One process: no
// communication. Synchronises `stream`.
void load_weights(Module& model, const std::string& path, const Stream& stream);
// Writes the model's parameters to `path` atomically (a reader sees the old file or the whole new one).
void save_weights(const Module& model, const std::string& path, const Stream& stream);

// Collective: every rank reads `path` itself (every rank must see the same file) and checks it; only when every
// rank could does any load it, so the ranks' models stay alike. A failure on any rank throws CollectiveError
// "weights not loaded: ranks ...: ..." on every rank.
void load_weights(Session& session, Module& model, const std::string& path);
// Collective: rank 0 writes `path` atomically; a failure throws CollectiveError "weights not saved: rank 0: ..."
// on every rank.
void save_weights(Session& session, const Module& model, const std::string& path);

}  // namespace ddp::training
