// This node's GPUs, in CUDA's numbering, by PCI address: what ddprun needs to bind each rank near its GPU.
//
// Why not simply ask CUDA: the launcher's first CUDA call starts CUDA in ddprun itself, a noticeable part of a
// second before mpirun can even start, on every launch. The NVIDIA driver lists its
// GPUs under /proc/driver/nvidia/gpus/ADDRESS/ at no cost, and CUDA numbers identical GPUs in PCI order, so that
// listing is CUDA's numbering when (a) CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are unset and (b) every GPU is
// the same model (CUDA puts the fastest first otherwise). In any other case, and on a machine without the
// listing, the CUDA runtime answers.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// The PCI addresses ("0000:1b:00.0", lower case, as sysfs spells them) of the GPUs listed under `driver_dir`
// (the driver's /proc/driver/nvidia/gpus), sorted; nothing when the directory is missing or empty, or when its GPUs
// are not all the same model (each ADDRESS/information file's "Model:" line).
std::optional<std::vector<std::string>> gpus_listed_by_driver(const std::string& driver_dir);

// This node's GPUs in CUDA's numbering: the driver's listing where it is CUDA's numbering (see above), else the
// CUDA runtime's (an entry is "" where CUDA cannot give an address). Reads the environment.
std::vector<std::string> local_gpu_addresses();

}  // namespace launcher
}  // namespace ddp
