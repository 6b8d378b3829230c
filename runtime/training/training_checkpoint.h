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
// `stream` (synchronises it). Call on one rank only.
std::string save_training_checkpoint(const std::string& dir, const Module& model, const Optimizer& optimizer,
                                     const io::CheckpointMetadata& metadata, const Stream& stream,
                                     int keep_last = 3);

// Loads the model's parameters and the optimizer's state (and its step count) from `checkpoint`, refusing a
// file whose tensors do not match the model by name, dtype or shape (the message names the file and tensor).
void restore_training_checkpoint(const io::LoadedCheckpoint& checkpoint, Module& model, Optimizer& optimizer,
                                 const Stream& stream);

}  // namespace ddp::training
