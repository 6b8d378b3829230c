#include "runtime/core/device.h"

#include <cctype>

#include <cuda_runtime_api.h>

#include "runtime/core/check.h"

namespace ddp {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

const CudaAvailability& cuda_availability() {
  static const CudaAvailability availability = [] {
    CudaAvailability a;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      a.reason = "no usable CUDA device (cudaGetDeviceCount returned " + detail::cuda_error_string(status) + ")";
      (void)cudaGetLastError();  // discovery must not leave a sticky error behind
      return a;
    }
    a.device_count = count;
    if (count == 0) a.reason = "no usable CUDA device (the driver reports none)";
    return a;
  }();
  return availability;
}

int cuda_device_count() { return cuda_availability().device_count; }

std::size_t cuda_free_memory(const Device& device) {
  if (!device.is_cuda()) return 0;
  CudaDeviceGuard guard(device);
  std::size_t free = 0, total = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

std::string cuda_pci_address(int index) {
  if (index < 0 || index >= cuda_device_count()) return "";
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, index) != cudaSuccess) return "";
  // CUDA writes an 8-digit domain in upper case ("00000000:1B:00.0"); sysfs a 4-digit one in lower case.
  std::string address(id);
  const std::size_t colon = address.find(':');
  if (colon == std::string::npos || colon < 4) return "";
  address = address.substr(colon - 4);
  for (char& c : address) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return address;
}

CudaDeviceGuard::CudaDeviceGuard(const Device& device) {
  if (!device.is_cuda()) return;
  DDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device.index) {
    DDP_CUDA_CHECK(cudaSetDevice(device.index));
  } else {
    previous_ = -1;
  }
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0) DDP_CUDA_WARN(cudaSetDevice(previous_));
}

}  // namespace ddp
