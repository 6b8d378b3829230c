// GPU discovery for ddprun without starting CUDA (see gpus.h).
#include "launcher/gpus.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include "runtime/core/device.h"

namespace ddp {
namespace launcher {
namespace {

// The "Model:" line of a GPU's information file, without the label; "" when there is none.
std::string model_of(const std::string& information_file) {
  std::ifstream in(information_file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Model:", 0) != 0) continue;
    const size_t start = line.find_first_not_of(" \t", 6);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

bool set_in_environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr;
}

}  // namespace

std::optional<std::vector<std::string>> gpus_listed_by_driver(const std::string& driver_dir) {
  DIR* dir = ::opendir(driver_dir.c_str());
  if (dir == nullptr) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> gpus;  // (address for sysfs, the directory's own name)
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.') continue;
    std::string address = name;
    for (char& c : address) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    gpus.emplace_back(address, name);
  }
  ::closedir(dir);
  if (gpus.empty()) return std::nullopt;
  std::sort(gpus.begin(), gpus.end());
  const std::string model = model_of(driver_dir + "/" + gpus.front().second + "/information");
  std::vector<std::string> addresses;
  for (const auto& [address, name] : gpus) {
    if (model.empty() || model_of(driver_dir + "/" + name + "/information") != model) return std::nullopt;
    addresses.push_back(address);
  }
  return addresses;
}

std::vector<std::string> local_gpu_addresses() {
  if (!set_in_environment("CUDA_VISIBLE_DEVICES") && !set_in_environment("CUDA_DEVICE_ORDER")) {
    if (std::optional<std::vector<std::string>> listed = gpus_listed_by_driver("/proc/driver/nvidia/gpus")) {
      return *listed;
    }
  }
  std::vector<std::string> addresses;
  for (int gpu = 0; gpu < cuda_device_count(); ++gpu) addresses.push_back(cuda_pci_address(gpu));
  return addresses;
}

}  // namespace launcher
}  // namespace ddp
