// The GEMM floor of step_bench --gemm-floor: the MLP step's GEMMs alone, the same cuBLASLt calls (shapes,
// types, transposes, algorithms, the same dx/dw streams) with no epilogue and nothing else around them, timed as
// the step is. It is below the public API on purpose (it calls the kernel layer directly), which is why it
// lives in a file of its own: step_bench itself is written against ddp.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp.h"

namespace ddp::bench {

struct GemmFloorOptions {
  std::int64_t batch = 256;
  std::string precision = "fp32";  // fp32 | tf32 | bf16
  int warmup = 10;
  int iters = 20;
  int repeats = 5;
};

// Median microseconds of the forward GEMM and the backward dw and dx GEMMs (no dx for the first layer) of an MLP
// with `sizes`, on random operands on `device` (a GPU), enqueued on `stream`.
double time_gemms_alone(const GemmFloorOptions& options, const std::vector<std::int64_t>& sizes,
                        const Device& device, const Stream& stream);

}  // namespace ddp::bench
