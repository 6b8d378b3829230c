// Where a tensor lives and which devices this process can use.
//
// Discovery never throws: on a machine without a driver (CI, laptops) `cudaGetDeviceCount` fails, and the
// runtime runs on the CPU and says why, instead of crashing at the first CUDA call.
#pragma once

#include <cstddef>
#include <string>

namespace ddp {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  std::string str() const;  // "cpu" or "cuda:N"
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// What `cudaGetDeviceCount` reported, once per process.
struct CudaAvailability {
  int device_count = 0;
  // Empty when at least one GPU is usable; otherwise why not, in words a user can act on.
  std::string reason;
};

const CudaAvailability& cuda_availability();
int cuda_device_count();
// The PCI address of CUDA device `index` as sysfs spells it ("0000:1b:00.0"), so that its NUMA node can be read
// from /sys/bus/pci/devices/ADDRESS/numa_node; empty when CUDA cannot say.
std::string cuda_pci_address(int index);
// Bytes of `device`'s memory free now (cudaMemGetInfo), for deciding whether a data set fits; 0 for the CPU.
std::size_t cuda_free_memory(const Device& device);

// Makes `device` current for the calling thread for the guard's lifetime (no-op for the CPU).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(const Device& device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace ddp
