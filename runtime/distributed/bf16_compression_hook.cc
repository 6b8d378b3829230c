#include "runtime/distributed/bf16_compression_hook.h"

#include <cstdint>

#include "runtime/kernels/dispatch.h"
#include "runtime/core/check.h"

namespace ddp {

BFloat16CompressionHook::BFloat16CompressionHook(const CommBuffer& gradients, const Stream& compute)
    : base_(gradients) {
  DDP_CHECK(gradients.dtype == DType::kFloat32, "bf16 compression takes a float32 gradient buffer");
  DDP_CHECK(compute.device() == gradients.device || gradients.device.is_cpu(),
            "bf16 compression: the gradients are on " + gradients.device.str() + ", the stream on " +
                compute.device().str());
  compressed_ = Tensor::empty({gradients.count}, DType::kBFloat16, gradients.device, compute);
}

CommBuffer BFloat16CompressionHook::compressed_view(const CommBuffer& gradients) const {
  const std::ptrdiff_t offset = static_cast<const float*>(gradients.data) - static_cast<const float*>(base_.data);
  DDP_ASSERT(offset >= 0 && offset + gradients.count <= base_.count, "bucket outside the hook's gradient buffer");
  return CommBuffer{compressed_.data<std::uint16_t>() + offset, gradients.count, DType::kBFloat16, gradients.device};
}

std::shared_ptr<Work> BFloat16CompressionHook::start(ProcessGroup& group, std::size_t, const CommBuffer& gradients,
                                                     const Stream& compute) {
  const CommBuffer packed = compressed_view(gradients);
  DDP_DISPATCH(gradients.device, cast, DType::kFloat32, gradients.data, DType::kBFloat16, packed.data,
               gradients.count, compute.handle());
  return group.all_reduce(packed, ReduceOp::kAverage, compute);
}

void BFloat16CompressionHook::finish(std::size_t, const CommBuffer& gradients, const Stream& compute) {
  const CommBuffer packed = compressed_view(gradients);
  DDP_DISPATCH(gradients.device, cast, DType::kBFloat16, packed.data, DType::kFloat32, gradients.data,
               gradients.count, compute.handle());
}

}  // namespace ddp
