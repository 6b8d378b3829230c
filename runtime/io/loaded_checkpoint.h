// A checkpoint read back and verified: its metadata decoded and its tensors readable, and the two ways to get one.
// Apart from checkpoint.h so that the public header (ddp.h) does not pull in the safetensors reader: a program
// resumes through training::restore_latest_training_checkpoint, whose checks see a CheckpointContents.
#pragma once

#include <optional>
#include <string>

#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"

namespace ddp {
namespace io {

struct LoadedCheckpoint {
  std::string path;
  CheckpointMetadata metadata;
  SafetensorsFile file;

  CheckpointContents contents() const;
};

// Loads and verifies one checkpoint (checksums of the tensors and of the metadata required, metadata decoded
// and in range, step matching the name when the name has one); throws InvalidArgument naming the file and what
// is wrong.
LoadedCheckpoint load_checkpoint(const std::string& path);

// The newest checkpoint of `dir` that loads and verifies. Every newer one that does not is skipped with a
// warning naming the file and why; temporary files are ignored. nullopt when there is none.
// With `check`, a checkpoint it refuses is skipped too, with its reason.
std::optional<LoadedCheckpoint> latest_complete_checkpoint(const std::string& dir,
                                                           const WarningSink& warn = warn_to_stderr,
                                                           const CheckpointCheck& check = nullptr);

}  // namespace io
}  // namespace ddp
