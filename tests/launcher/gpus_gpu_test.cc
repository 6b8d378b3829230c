// On a machine with GPUs: the launcher's GPU list (the driver's listing where it applies, launcher/gpus.h) is
// the CUDA runtime's numbering, address for address, so ddprun binds each rank near the GPU it will use.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/gpus.h"
#include "runtime/core/device.h"

namespace ddp {
namespace launcher {
namespace {

TEST(GpusOnAGpuMachine, TheLaunchersListIsCudasNumbering) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_availability().reason;
  std::vector<std::string> cuda;
  for (int gpu = 0; gpu < cuda_device_count(); ++gpu) cuda.push_back(cuda_pci_address(gpu));
  EXPECT_EQ(local_gpu_addresses(), cuda);
  // Where the driver lists its GPUs and they are all one model, that listing is what the launcher used.
  if (const auto listed = gpus_listed_by_driver("/proc/driver/nvidia/gpus")) {
    EXPECT_EQ(*listed, cuda);
  }
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
