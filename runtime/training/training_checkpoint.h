// A training run's checkpoint: the model's parameters under PyTorch's state_dict names (so
// torch.nn.Sequential(...).load_state_dict takes them), the optimizer's state per parameter
// ("optimizer.<state>.<param>"), and where the run stands (step, epoch, sampler position, seed, world size).
// The file format, the atomic write and the verification on load are runtime/io's; this file maps a Module
// and an Optimizer onto it.
#pragma once

#include <optional>
#include <string>

#include "models/module.h"
#include "runtime/io/checkpoint.h"
#include "runtime/optim/optimizer.h"

namespace ddp::training {

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

// Loads the model's parameters and the optimizer's state (and its step count) from `checkpoint`, refusing a
// file whose tensors do not match the model by name, dtype or shape (the message names the file and tensor).
// A sharded optimizer takes its shard of each tensor; every rank checks every tensor, so a mismatch is refused
// on every rank alike. No communication: each rank reads the file itself.
void restore_training_checkpoint(const io::LoadedCheckpoint& checkpoint, Module& model, Optimizer& optimizer,
                                 const Stream& stream);

}  // namespace ddp::training
