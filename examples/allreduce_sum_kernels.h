// The GPU half of //examples:allreduce_sum: double every element, then sum in double precision.
#pragma once

#include <cstddef>

struct CUstream_st;

namespace ddp::examples {

// data[i] *= 2 for i < n, then *sum = sum of data in double precision. `sum` is device memory; everything is
// ordered on `stream`. The reduction is two-pass (per-block partials, then one block), so it is deterministic.
void double_and_sum_cuda(float* data, std::size_t n, double* sum, double* scratch, std::size_t scratch_len,
                         CUstream_st* stream);

// The number of partial sums double_and_sum_cuda needs in `scratch`.
std::size_t double_and_sum_scratch(std::size_t n);

}  // namespace ddp::examples
