// Checkpoint directories: naming, saving with retention, and finding the newest checkpoint that is whole.
//
// Conventions (the PyTorch side relies on them):
// - One file per checkpoint, DIR/ckpt-<step, 8 digits zero-padded>.safetensors, e.g. ckpt-00000100.safetensors
//   (more digits once step exceeds 99999999). Written atomically, so a name of this form is always a finished
//   write; an interrupted write leaves only a hidden ".ckpt-....tmp-XXXXXX" file, skipped and later removed.
// - Model tensors keep exactly PyTorch's state_dict names for the same nn.Sequential ("0.weight", "0.bias",
//   "2.weight", ...). Optimizer state travels in the same file (one rename makes model and optimizer agree)
//   under "optimizer.<state>.<parameter name>", e.g. "optimizer.exp_avg.0.weight",
//   "optimizer.momentum_buffer.2.bias". PyTorch loads the model with
//       sd = safetensors.torch.load_file(path)
//       model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optimizer.")})
// - __metadata__ (strings only) carries "ddp.format" = "ddp-checkpoint/2", "ddp.step", "ddp.epoch",
//   "ddp.sampler_position" (the global sample position within the epoch, see runtime/data/sampler.h),
//   "ddp.world_size", "ddp.seed", "ddp.rng_state", the per-tensor "ddp.crc32:NAME" checksums, the checksum of
//   the metadata itself ("ddp.crc32:__metadata__", safetensors.h; required from format 2 on, format 1 files
//   are still read), and any caller keys (which must not start with "ddp.").
// - One process (rank 0) writes a directory; every rank may read it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"

namespace ddp {
namespace io {

struct TensorSource;  // runtime/io/safetensors.h

constexpr const char* kCheckpointFormat = "ddp-checkpoint/2";
// Written before the metadata had a checksum: still read.
constexpr const char* kCheckpointFormatWithoutMetadataChecksum = "ddp-checkpoint/1";
constexpr const char* kOptimizerPrefix = "optimizer.";

// "ckpt-00000100.safetensors"
std::string checkpoint_file_name(int64_t step);
// The step of a checkpoint file name, or nullopt for any other name (temporary files included).
std::optional<int64_t> parse_checkpoint_file_name(const std::string& file_name);

// "optimizer.exp_avg.0.weight"
std::string optimizer_tensor_name(const std::string& state, const std::string& parameter);
bool is_optimizer_tensor(const std::string& name);

struct CheckpointMetadata {
  int64_t step = 0;              // optimizer steps taken since the run began (across resumes)
  int64_t epoch = 0;             // the epoch to continue in
  int64_t sampler_position = 0;  // global sample position within that epoch
  int world_size = 1;
  uint64_t seed = 0;
  std::string rng_state;  // opaque to this layer (e.g. a serialised generator)
  std::map<std::string, std::string> extra;  // caller keys, not starting with "ddp."

  std::map<std::string, std::string> encode() const;
  // Throws InvalidArgument naming `source` for a missing or malformed key.
  static CheckpointMetadata decode(const std::map<std::string, std::string>& metadata, const std::string& source);
};

struct CheckpointFile {
  std::string path;
  int64_t step = 0;
};

// Checkpoint files of `dir` by name (not verified), oldest step first; empty when the directory does not exist.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// Writes DIR/ckpt-<step>.safetensors atomically (creating DIR if needed), then keeps the `keep_last` newest
// checkpoints (0 keeps all) and removes stale temporary files. Returns the path written.
std::string save_checkpoint(const std::string& dir, const CheckpointMetadata& metadata,
                            const std::vector<TensorSource>& tensors, int keep_last = 0);

// What a check sees of a checkpoint that verifies, before anything is loaded from it: its file, its metadata and
// its tensors' names, types and shapes.
struct CheckpointTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};
struct CheckpointContents {
  std::string path;
  CheckpointMetadata metadata;
  std::vector<CheckpointTensor> tensors;  // in the file's order
  const CheckpointTensor* find(const std::string& name) const;  // null when the file has no such tensor
};

// Why a checkpoint cannot be used although it verifies ("" when it can): a caller's checks of what it holds
// against what only the caller knows (the data set's size, the model's recipe). A checkpoint it refuses is
// skipped as a damaged one is (latest_complete_checkpoint in runtime/io/loaded_checkpoint.h), or refused
// (training::restore_latest_training_checkpoint).
using CheckpointCheck = std::function<std::string(const CheckpointContents&)>;

using WarningSink = std::function<void(const std::string&)>;
// Prints "ddp: warning: ..." to stderr.
void warn_to_stderr(const std::string& message);

// Removes all but the `keep_last` newest checkpoint files, and leftover temporary files of interrupted writes.
void prune_checkpoints(const std::string& dir, int keep_last);

// One job's exclusive use of a checkpoint directory while this object lives: an flock on DIR itself (and on
// DIR/.lock; the kernel drops them when the process dies, so a crashed job never leaves the directory locked,
// and deleting .lock does not unlock it), with DIR/.lock's contents naming the holder. Creates DIR. Throws
// InvalidArgument when DIR cannot be created or written (naming it and why), or when another job holds it
// (naming that job), so both are found before the first step, not after training.
class CheckpointDirectoryLock {
 public:
  explicit CheckpointDirectoryLock(const std::string& dir);
  ~CheckpointDirectoryLock();
  CheckpointDirectoryLock(const CheckpointDirectoryLock&) = delete;
  CheckpointDirectoryLock& operator=(const CheckpointDirectoryLock&) = delete;

 private:
  int fd_ = -1;      // DIR/.lock
  int dir_fd_ = -1;  // DIR
};

}  // namespace io
}  // namespace ddp
