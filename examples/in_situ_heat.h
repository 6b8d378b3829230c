// The in-situ example's solver, cell by cell: one definition compiled for the host (the CPU run) and by nvcc
// for the GPU (examples/in_situ_heat_kernels.cu), so the two runs compute the same plate bit for bit (the
// kernels are compiled without contracting multiply-adds, as the host code is) and draw the same cells.
//
//   u' = u + r · (0.5 + u²) · (up + down + left + right − 4u)      nonlinear heat diffusion
//
// A band is (rows + 2) x (cols + 2) floats, row-major: the interior rows 1..rows and columns 1..cols, a ghost
// row above and below (the neighbours' boundary rows, or the plate's fixed edges) and the fixed edge columns.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define IN_SITU_HD __host__ __device__
#else
#define IN_SITU_HD
#endif

namespace in_situ {

constexpr int kInputs = 5;      // a cell's stencil: u and its four neighbours' differences from u
constexpr float kRate = 0.15f;  // r
constexpr float kScale = 20.0f;  // differences between neighbouring cells are a few hundredths: magnified

// The update (u' − u) / r from a cell and its neighbours.
IN_SITU_HD inline float update(float u, float up, float down, float left, float right) {
  return static_cast<float>((0.5 + double(u) * u) * (double(up) + down + left + right - 4.0 * u));
}

// u' of interior cell (r, c) of a band `width` = cols + 2 wide.
IN_SITU_HD inline float next_value(const float* u, long long width, long long r, long long c) {
  const float* p = u + r * width + c;
  return p[0] + kRate * update(p[0], p[-width], p[width], p[-1], p[1]);
}

// SplitMix64: the cells of a draw depend on (key, i) alone, on either device.
IN_SITU_HD inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Sample i of draw `key`: a cell of the band's interior at random, its stencil into x[0..5) (the value and its
// neighbours' differences from it, magnified) and its update, magnified alike, into *y.
IN_SITU_HD inline void sample_cell(const float* u, long long rows, long long cols, std::uint64_t key, long long i,
                                   float* x, float* y) {
  const std::uint64_t h = mix(key + static_cast<std::uint64_t>(i));
  const long long width = cols + 2;
  const long long r = 1 + static_cast<long long>((h & 0xffffffffULL) % static_cast<std::uint64_t>(rows));
  const long long c = 1 + static_cast<long long>((h >> 32) % static_cast<std::uint64_t>(cols));
  const float* p = u + r * width + c;
  const float centre = p[0], up = p[-width], down = p[width], left = p[-1], right = p[1];
  x[0] = centre;
  x[1] = kScale * (up - centre);
  x[2] = kScale * (down - centre);
  x[3] = kScale * (left - centre);
  x[4] = kScale * (right - centre);
  *y = kScale * update(centre, up, down, left, right);
}

}  // namespace in_situ
