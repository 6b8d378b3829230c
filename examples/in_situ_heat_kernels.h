// The in-situ example's solver on the GPU: the application's own kernels over its own device arrays, as a CUDA
// simulation has them (the cell-level code is examples/in_situ_heat.h, shared with the CPU run).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace in_situ {

// next = u's update on interior rows [first, last] of a band (rows + 2) x (cols + 2), on `stream`.
void heat_rows_cuda(const float* u, float* next, long long cols, long long first, long long last,
                    CUstream_st* stream);
// `count` samples of draw `key` (sample_cell) into x [count, kInputs] and y [count], device memory, on `stream`.
void sample_cells_cuda(const float* u, long long rows, long long cols, std::uint64_t key, long long count, float* x,
                       float* y, CUstream_st* stream);

}  // namespace in_situ
