// bfloat16 <-> float conversion on the host: the CPU kernels and the MPI backend's bfloat16 reductions.
//
// Why: the CPU has no bf16 arithmetic, so bf16 code widens to float, computes there and rounds back. The
// rounding is round-to-nearest-even with NaN kept quiet, the same as CUDA's __float2bfloat16_rn, so CPU and
// GPU results of the same float value are bitwise equal.
#pragma once

#include <cstdint>
#include <cstring>

namespace ddp {

inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // NaN
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace ddp
