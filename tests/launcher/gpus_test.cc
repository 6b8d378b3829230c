// The driver's GPU listing (launcher/gpus.h) read from a fake /proc/driver/nvidia/gpus: addresses sorted and in
// sysfs's lower case when every GPU is the same model; nothing (so the CUDA runtime answers) when the models
// differ, a GPU's information file is missing, or there is no listing at all.
#include "launcher/gpus.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ddp {
namespace launcher {
namespace {

std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void add_gpu(const std::string& dir, const std::string& address, const std::string& model) {
  ::mkdir((dir + "/" + address).c_str(), 0755);
  if (model.empty()) return;
  std::ofstream(dir + "/" + address + "/information") << "Model: \t " << model << "\nIRQ:   42\nBus Location: "
                                                      << address << "\n";
}

TEST(Gpus, TheDriversListingInPciOrderWhenEveryGpuIsTheSameModel) {
  const std::string dir = fresh_dir("same-model");
  add_gpu(dir, "0000:9A:00.0", "NVIDIA H200");
  add_gpu(dir, "0000:1B:00.0", "NVIDIA H200");
  add_gpu(dir, "0000:3c:00.0", "NVIDIA H200");
  const auto listed = gpus_listed_by_driver(dir);
  ASSERT_TRUE(listed.has_value());
  EXPECT_EQ(*listed, (std::vector<std::string>{"0000:1b:00.0", "0000:3c:00.0", "0000:9a:00.0"}));
}

TEST(Gpus, NothingWhereCudasNumberingCouldDiffer) {
  const std::string mixed = fresh_dir("mixed-models");
  add_gpu(mixed, "0000:1b:00.0", "NVIDIA H200");
  add_gpu(mixed, "0000:3c:00.0", "NVIDIA A100-SXM4-80GB");
  EXPECT_FALSE(gpus_listed_by_driver(mixed).has_value());

  const std::string unknown = fresh_dir("no-information");
  add_gpu(unknown, "0000:1b:00.0", "NVIDIA H200");
  add_gpu(unknown, "0000:3c:00.0", "");
  EXPECT_FALSE(gpus_listed_by_driver(unknown).has_value());

  EXPECT_FALSE(gpus_listed_by_driver(fresh_dir("empty")).has_value());
  EXPECT_FALSE(gpus_listed_by_driver(fresh_dir("empty") + "/missing").has_value());
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
