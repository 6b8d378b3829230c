// A communication hook that halves the bytes on the wire: each bucket is cast to bfloat16 on the compute
// stream, all-reduced (averaged) in bfloat16, and cast back into the float32 gradients. The same trade as
// PyTorch's bf16_compress_hook: gradients lose precision (8 bits of mantissa) in exchange for bandwidth.
#pragma once

#include <memory>

#include "runtime/distributed/reducer.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

class BFloat16CompressionHook : public CommHook {
 public:
  // `gradients` is the reducer's whole flat float32 buffer; the hook keeps a bfloat16 twin of it, from the
  // caching allocator on `compute`'s device.
  BFloat16CompressionHook(const CommBuffer& gradients, const Stream& compute);

  std::shared_ptr<Work> start(ProcessGroup& group, std::size_t bucket, const CommBuffer& gradients,
                              const Stream& compute) override;
  void finish(std::size_t bucket, const CommBuffer& gradients, const Stream& compute) override;

 private:
  CommBuffer compressed_view(const CommBuffer& gradients) const;

  CommBuffer base_;
  Tensor compressed_;  // bfloat16 [base_.count] on base_.device
};

}  // namespace ddp
