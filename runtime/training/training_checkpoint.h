// A training run's checkpoint: the model's parameters under PyTorch's state_dict names (so
// torch.nn.Sequential(...).load_state_dict takes them), the optimizer's state per parameter
// ("optimizer.<state>.<param>"), the model's buffers ("buffer.<name>", Dropout's draw counters: drop the
// "optimizer." and "buffer." keys before a strict load_state_dict in PyTorch), and where the run stands (step,
// epoch, sampler position, seed, world size).
// The file format, the atomic write and the verification on load are runtime/io's; this file maps a Module
// and an Optimizer onto it.
//
// In a distributed program the two Session calls are all there is to it:
//
//   ddp::io::CheckpointMetadata where;           // step, epoch, sampler_position, seed, extra (yours)
//   ddp::training::save_training_checkpoint(session, dir, model, optimizer, where);
//   std::optional<ddp::training::RestoredCheckpoint> resumed =
//       ddp::training::restore_latest_training_checkpoint(session, dir, model, optimizer);  // resumed->metadata
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/distributed/session.h"
#include "runtime/io/checkpoint.h"
#include "runtime/models/module.h"
#include "runtime/optim/optimizer.h"

namespace ddp::training {

// The key of a module buffer (Module::named_buffers) in a training checkpoint: "buffer.1.draw". A parameter
// key starts with a child's name or a parameter's, and no layer of the runtime names one "buffer".
constexpr const char* kBufferPrefix = "buffer.";
std::string buffer_tensor_name(const std::string& buffer);

// Collective: rank 0 writes DIR/ckpt-<metadata.step>.safetensors atomically (DIR is created; the `keep_last`
// newest checkpoints are kept, 0 keeps all) with metadata.world_size set to the session's; every rank returns
// once it is written. A failure (a full disk, an unwritable DIR) throws CollectiveError "checkpoint write
// failed: rank 0: ..." on every rank, and the previous checkpoint stays valid. A sharded optimizer's state is
// gathered to rank 0 from every rank while it writes. Synchronises the session's stream. Returns the path
// written.
std::string save_training_checkpoint(Session& session, const std::string& dir, const Module& model,
                                     const Optimizer& optimizer, const io::CheckpointMetadata& metadata,
                                     int keep_last = 3);

// The checkpoint a run continues from: its file and where the run stood.
struct RestoredCheckpoint {
  std::string path;
  io::CheckpointMetadata metadata;
};

// Collective: every rank loads the newest checkpoint of DIR that verifies (newer damaged ones are skipped
// with a warning) into `model` and `optimizer` and returns its path and metadata; nullopt on every rank when DIR holds
// none (or does not exist). A checkpoint that does not fit the model or that `refuse` refuses (asked before
// anything is loaded: a program's own checks of what it holds), or one that only some ranks can see, throws
// CollectiveError "cannot resume: ..." on
// every rank. Synchronises the session's stream.
//
// Damage is skipped like a damaged file, falling back to the previous checkpoint that verifies (with a warning
// naming the file and why): a checksum that does not match (tensors or metadata), metadata out of range (a
// negative step, epoch or position; with `dataset_size` >= 0, a sampler position past the data set of that many
// samples; an optimizer step count that is not a non-negative integer).
std::optional<RestoredCheckpoint> restore_latest_training_checkpoint(Session& session, const std::string& dir,
                                                                     Module& model, Optimizer& optimizer,
                                                                     const io::CheckpointCheck& refuse = nullptr,
                                                                     std::int64_t dataset_size = -1);

// Why `checkpoint`'s metadata is out of range for a run over a data set of `dataset_size` samples (< 0:
// unknown), "" when it is not: the checks restore_latest_training_checkpoint falls back on.
std::string metadata_out_of_range(const io::CheckpointContents& checkpoint, std::int64_t dataset_size);

// Writes DIR/ckpt-<step>.safetensors atomically, keeping the `keep_last` newest. Reads the device buffers on
// `stream` (synchronises it), one tensor at a time. Call on one rank only, unless the optimizer is sharded
// (DdpOptions::shard_optimizer): then every rank calls it, each rank's shard of every optimizer tensor is
// gathered to rank 0 while rank 0 writes that tensor (no rank ever holds more than one tensor of it), rank 0
// returns the path and the others "". The file is the same either way: it does not depend on the world size or
// on sharding. Should rank 0's write fail, or a rank fail to contribute, no file is committed, the other ranks
// are not left waiting, and the failing rank throws.
std::string save_training_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                                     const io::CheckpointMetadata& metadata, const Stream& stream,
                                     int keep_last = 3);

// Loads the model's parameters, its buffers (when the file has them: an older checkpoint leaves them as they
// are) and the optimizer's state (and its step count) from the checkpoint file `path`, verified first
// (InvalidArgument naming the file and what is wrong), refusing a
// file whose tensors do not match the model by name, dtype or shape (the message names the file and tensor),
// and one that holds tensors the model and optimizer do not have (a deeper model's: the message names them).
// A sharded optimizer takes its shard of each tensor; every rank checks every tensor, so a mismatch is refused
// on every rank alike. No communication: each rank reads the file itself.
void restore_training_checkpoint(const std::string& path, Module& model, Optimizer& optimizer, const Stream& stream);

}  // namespace ddp::training
