// Samples with a value that is not finite (a NaN or an infinity from a simulation), found before they reach a
// model: one such sample in a batch turns the loss, then every weight, into NaN, and training never recovers. By
// default they are refused, naming the first; a program that expects the odd bad state has them skipped and
// counted instead. The in-situ step and the replay buffer both check what they are given through here.
#pragma once

#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::data {

enum class NonFinitePolicy {
  kRefuse,  // InvalidArgument naming the first sample (row) and value (column) that is not finite
  kSkip,    // such samples are dropped, and counted
};

// Samples x [n, a] and y [n, b] that passed the check.
struct FiniteSamples {
  Tensor x, y;               // the samples given when all are finite; else copies of the finite ones (may be none)
  std::int64_t skipped = 0;  // samples dropped (kSkip only)
};

// Checks the samples x [n, a] and y [n, b] (float32, contiguous, on one device: host memory or a GPU, where the
// check runs; a GPU's result is read back, synchronising `stream`). Under kRefuse, a value that is not finite
// throws InvalidArgument naming its array, row and column (the first in row order, x before y within a row).
FiniteSamples finite_samples(const Tensor& x, const Tensor& y, NonFinitePolicy policy,
                             const Stream& stream = current_stream());

// The refusal finite_samples throws, for a value found elsewhere (kernels' copy_samples_checked): the sample at
// `row`, value `column` of its x (`column` < a, x's width) then its y (a + y's column).
InvalidArgument nonfinite_sample_error(std::int64_t row, std::int64_t column, std::int64_t a);

}  // namespace ddp::data
