// Tensor-level ops with autograd, part 3: losses (float32) and metrics.
//
// Losses return a one-element float32 tensor on the inputs' device (no host read-back); their gradient is
// computed in the same pass as the forward and kept for backward, which then costs no extra kernel when the
// loss is what backward() starts from.
#pragma once

#include <cstdint>

#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops {

// Mean over the batch of −log softmax(logits)[label]; logits [batch, classes] float32 or bfloat16 (mixed
// precision, as autocast's logits: computed in float32, the gradient stored in bfloat16), labels [batch] int32.
// The loss is float32.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const Stream& stream = current_stream());
// Mean over all elements of (pred − target)²; same shape, float32. Only `pred` receives a gradient.
Tensor mse_loss(const Tensor& pred, const Tensor& target, const Stream& stream = current_stream());

// Row-wise argmax (int32 [batch]); ties go to the lowest index, as torch.argmax.
Tensor argmax(const Tensor& logits, const Stream& stream = current_stream());
// Number of rows whose argmax equals the label: an int64 tensor of one element on the device.
Tensor count_correct(const Tensor& logits, const Tensor& labels, const Stream& stream = current_stream());
// count_correct / batch, read back to the host (synchronises `stream`).
double accuracy(const Tensor& logits, const Tensor& labels, const Stream& stream = current_stream());

}  // namespace ddp::ops
