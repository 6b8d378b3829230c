// How the benchmarks time work, so that step_bench's step and its GEMM floor are measured the same way.
#pragma once

#include <functional>
#include <vector>

#include "ddp.h"

namespace ddp::bench {

// Microseconds per call over `calls` calls of `work`: CUDA events around them on a GPU's `stream` (the device
// time of what `work` enqueues), the steady clock on the CPU (where the work is done on return).
double time_per_call_us(const std::function<void()>& work, int calls, const Stream& stream);

// The median of `values` (the mean of the middle two for an even count).
double median(std::vector<double> values);

}  // namespace ddp::bench
