// A checkpoint read back and verified: its metadata decoded and its tensors readable. Apart from checkpoint.h
// so that the public header (ddp.h) does not pull in the safetensors reader and the atomic-file writer.
#pragma once

#include <string>

#include "runtime/io/checkpoint.h"
#include "runtime/io/safetensors.h"

namespace ddp {
namespace io {

struct LoadedCheckpoint {
  std::string path;
  CheckpointMetadata metadata;
  SafetensorsFile file;
};

}  // namespace io
}  // namespace ddp
