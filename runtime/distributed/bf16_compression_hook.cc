#include "runtime/distributed/bf16_compression_hook.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp {

BFloat16CompressionHook::BFloat16CompressionHook(const CommBuffer& gradients) : base_(gradients) {
  DDP_CHECK(gradients.dtype == DType::kFloat32, "bf16 compression takes a float32 gradient buffer");
  const std::size_t bytes = static_cast<std::size_t>(gradients.count) * sizeof(std::uint16_t);
  if (gradients.device.is_cuda()) {
    CudaDeviceGuard guard(gradients.device);
    DDP_CUDA_CHECK(cudaMalloc(&compressed_, bytes));
  } else {
    compressed_ = std::malloc(bytes);
    DDP_CHECK(compressed_ != nullptr || bytes == 0, "out of host memory for the bf16 gradient copy");
  }
}

BFloat16CompressionHook::~BFloat16CompressionHook() {
  if (base_.device.is_cuda()) {
    if (compressed_ != nullptr) DDP_CUDA_WARN(cudaFree(compressed_));
  } else {
    std::free(compressed_);
  }
}

CommBuffer BFloat16CompressionHook::compressed_view(const CommBuffer& gradients) const {
  const std::ptrdiff_t offset = static_cast<const float*>(gradients.data) - static_cast<const float*>(base_.data);
  DDP_CHECK(offset >= 0 && offset + gradients.count <= base_.count, "bucket outside the hook's gradient buffer");
  return CommBuffer{static_cast<std::uint16_t*>(compressed_) + offset, gradients.count, DType::kBFloat16,
                    gradients.device};
}

std::shared_ptr<Work> BFloat16CompressionHook::start(ProcessGroup& group, std::size_t, const CommBuffer& gradients,
                                                     const Stream& compute) {
  const CommBuffer packed = compressed_view(gradients);
  if (gradients.device.is_cuda()) {
    kernels::cuda::cast(DType::kFloat32, gradients.data, DType::kBFloat16, packed.data, gradients.count,
                        compute.handle());
  } else {
    kernels::cpu::cast(DType::kFloat32, gradients.data, DType::kBFloat16, packed.data, gradients.count,
                       nullptr);
  }
  return group.all_reduce(packed, ReduceOp::kAverage, compute);
}

void BFloat16CompressionHook::finish(std::size_t, const CommBuffer& gradients, const Stream& compute) {
  const CommBuffer packed = compressed_view(gradients);
  if (gradients.device.is_cuda()) {
    kernels::cuda::cast(DType::kBFloat16, packed.data, DType::kFloat32, gradients.data, gradients.count,
                        compute.handle());
  } else {
    kernels::cpu::cast(DType::kBFloat16, packed.data, DType::kFloat32, gradients.data, gradients.count,
                       nullptr);
  }
}

}  // namespace ddp
