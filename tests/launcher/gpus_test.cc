// The driver's GPU listing (launcher/gpus.h) read from a fake /proc/driver/nvidia/gpus: addresses sorted and in
// sysfs's lower case when every GPU is the same model; nothing (so the CUDA runtime answers) when the models
// differ, a GPU's information file is missing, or there is no listing at all.
#include "launcher/gpus.h"
#include "tests/scratch.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

namespace ddp {
namespace launcher {
namespace {

void add_gpu(const std::string& dir, const std::string& address, const std::string& model) {
  ::mkdir((dir + "/" + address).c_str(), 0755);
  if (model.empty()) return;
  std::ofstream(dir + "/" + address + "/information") << "Model: \t " << model << "\nIRQ:   42\nBus Location: "
                                                      << address << "\n";
}

TEST(Gpus, TheDriversListingInPciOrderWhenEveryGpuIsTheSameModel) {
  const std::string dir = ddp::testing::scratch_dir("same-model");
  add_gpu(dir, "0000:9A:00.0", "NVIDIA H200");
  add_gpu(dir, "0000:1B:00.0", "NVIDIA H200");
  add_gpu(dir, "0000:3c:00.0", "NVIDIA H200");
  const auto listed = gpus_listed_by_driver(dir);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(*listed, (std::vector<std::string>{"0000:1b:00.0", "0000:3c:00.0", "0000:9a:00.0"}));
}

TEST(Gpus, NothingWhereCudasNumberingCouldDiffer) {
  const std::string mixed = ddp::testing::scratch_dir("mixed-models");
  add_gpu(mixed, "0000:1b:00.0", "NVIDIA H200");
  add_gpu(mixed, "0000:3c:00.0", "NVIDIA A100-SXM4-80GB");
  EXPECT_FALSE(gpus_listed_by_driver(mixed).has_value());

  const std::string unknown = ddp::testing::scratch_dir("no-information");
  add_gpu(unknown, "0000:1b:00.0", "NVIDIA H200");
  add_gpu(unknown, "0000:3c:00.0", "");
  EXPECT_FALSE(gpus_listed_by_driver(unknown).has_value());

  EXPECT_FALSE(gpus_listed_by_driver(ddp::testing::scratch_dir("empty")).has_value());
  EXPECT_FALSE(gpus_listed_by_driver(ddp::testing::scratch_dir("empty") + "/missing").has_value());
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
