// The counter-based random number generator shared by the CPU (runtime/kernels/cpu/random.cc) and CUDA (runtime/kernels/cuda/random.cu)
// implementations of kernels::uniform / kernels::normal.
//
// Why a shared header: the contract says element i of a random fill depends only on (seed, offset + i), on every
// device. Keeping the generator in one place, compiled by g++ for the host and by nvcc for the device, is what
// makes the CPU and the GPU produce the same bits. Every value is a pure function of (seed, index): no state,
// no dependence on launch shape or thread count.
//
// How it stays bit-identical across compilers:
//   * Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") is integer-only.
//   * uniform: the top 24 bits scaled by 2^-24 are exact in float; the affine map to [low, high) is a single
//     explicit fmaf, which is correctly rounded on both sides (so no compiler may contract it differently).
//   * normal: Box–Muller computed in double with our own log and cos, built from +, -, *, /, sqrt and explicit
//     fma only, all IEEE correctly rounded on the host and on the device. libm's log/cos and CUDA's differ in the
//     last ulp, which is why they are not used. On the device every bare multiply/add goes through the _rn
//     intrinsics so nvcc cannot fuse them into an fma the host would not compute. The polynomials are accurate to
//     ~1e-16 relative, far below float resolution; determinism, not correct rounding, is the goal.
#pragma once

#include <cmath>    // std::sqrt, std::fma on the host
#include <cstdint>
#include <cstring>  // std::memcpy for bit casts on the host

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp::counter_rng {

// The third counter word separates the streams of different distributions, so uniform(seed, i) and
// normal(seed, i) are not computed from the same Philox block. Dropout's masks take their own stream and put the
// draw (the step) in the fourth word (and its bits above 32 above the stream id's), so (seed, draw, element)
// never meets another stream's counter.
enum class StreamId : std::uint32_t { kUniform = 0, kNormal = 1, kDropout = 2 };

struct Block {
  std::uint32_t v[4];
};

namespace detail {

DDP_HOST_DEVICE inline void mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t* hi, std::uint32_t* lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  *hi = static_cast<std::uint32_t>(p >> 32);
  *lo = static_cast<std::uint32_t>(p);
}

// Bare double arithmetic that no compiler may contract into an fma.
DDP_HOST_DEVICE inline double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;  // g++ in an ISO mode (-std=c++20) does not contract across statements; x86-64 SSE2 has no excess precision
#endif
}
DDP_HOST_DEVICE inline double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DDP_HOST_DEVICE inline double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
DDP_HOST_DEVICE inline double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
DDP_HOST_DEVICE inline double dsqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);  // IEEE 754 requires sqrt to be correctly rounded
#endif
}
DDP_HOST_DEVICE inline double dfma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DDP_HOST_DEVICE inline float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DDP_HOST_DEVICE inline float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DDP_HOST_DEVICE inline std::uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(x));
#else
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
DDP_HOST_DEVICE inline double bits_double(std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// Natural log for a positive, finite, normal x (the only inputs Box–Muller gives it: (0, 1]).
// x = m·2^e with m in [sqrt(1/2), sqrt(2)); log m = 2·atanh(s), s = (m−1)/(m+1), |s| < 0.1716, whose odd series
// converges to double precision in 13 terms.
DDP_HOST_DEVICE inline double log_positive(double x) {
  const std::uint64_t bits = double_bits(x);
  int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double m = bits_double((bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // m in [1, 2), exact
  if (m > 0x1.6a09e667f3bcdp+0) {                                                  // > sqrt(2): halve (exact)
    m = dmul(m, 0.5);
    e += 1;
  }
  const double s = ddiv(dsub(m, 1.0), dadd(m, 1.0));
  const double s2 = dmul(s, s);
  // Coefficients 1/(2k+1), k = 12 .. 0, as exact hex literals so both compilers see the same doubles.
  double p = 0x1.47ae147ae147bp-5;        // 1/25
  p = dfma(p, s2, 0x1.642c8590b2164p-5);  // 1/23
  p = dfma(p, s2, 0x1.8618618618618p-5);  // 1/21
  p = dfma(p, s2, 0x1.af286bca1af28p-5);  // 1/19
  p = dfma(p, s2, 0x1.e1e1e1e1e1e1ep-5);  // 1/17
  p = dfma(p, s2, 0x1.1111111111111p-4);  // 1/15
  p = dfma(p, s2, 0x1.3b13b13b13b14p-4);  // 1/13
  p = dfma(p, s2, 0x1.745d1745d1746p-4);  // 1/11
  p = dfma(p, s2, 0x1.c71c71c71c71cp-4);  // 1/9
  p = dfma(p, s2, 0x1.2492492492492p-3);  // 1/7
  p = dfma(p, s2, 0x1.999999999999ap-3);  // 1/5
  p = dfma(p, s2, 0x1.5555555555555p-2);  // 1/3
  p = dfma(p, s2, 1.0);
  const double log_m = dmul(dmul(2.0, s), p);
  return dfma(static_cast<double>(e), 0x1.62e42fefa39efp-1, log_m);  // + e·ln 2
}

// cos(x) and sin(x) for x in [0, π/4]: Taylor series to x^18 / x^19 (next term < 1e-19).
DDP_HOST_DEVICE inline double cos_small(double x) {
  const double x2 = dmul(x, x);
  double p = -0x1.6827863b97d97p-53;      // -1/18!
  p = dfma(p, x2, 0x1.ae7f3e733b81fp-45);  // 1/16!
  p = dfma(p, x2, -0x1.93974a8c07c9dp-37);  // -1/14!
  p = dfma(p, x2, 0x1.1eed8eff8d898p-29);  // 1/12!
  p = dfma(p, x2, -0x1.27e4fb7789f5cp-22);  // -1/10!
  p = dfma(p, x2, 0x1.a01a01a01a01ap-16);  // 1/8!
  p = dfma(p, x2, -0x1.6c16c16c16c17p-10);  // -1/6!
  p = dfma(p, x2, 0x1.5555555555555p-5);  // 1/4!
  p = dfma(p, x2, -0.5);
  return dfma(p, x2, 1.0);
}
DDP_HOST_DEVICE inline double sin_small(double x) {
  const double x2 = dmul(x, x);
  double p = -0x1.2f49b46814157p-57;      // -1/19!
  p = dfma(p, x2, 0x1.952c77030ad4ap-49);  // 1/17!
  p = dfma(p, x2, -0x1.ae7f3e733b81fp-41);  // -1/15!
  p = dfma(p, x2, 0x1.6124613a86d09p-33);  // 1/13!
  p = dfma(p, x2, -0x1.ae64567f544e4p-26);  // -1/11!
  p = dfma(p, x2, 0x1.71de3a556c734p-19);  // 1/9!
  p = dfma(p, x2, -0x1.a01a01a01a01ap-13);  // -1/7!
  p = dfma(p, x2, 0x1.1111111111111p-7);  // 1/5!
  p = dfma(p, x2, -0x1.5555555555555p-3);  // -1/3!
  p = dmul(p, x2);
  return dfma(p, x, x);  // x + x·x²·P
}

// cos(2π·t) for t in [0, 1) with at most 32 fractional bits, so every reduction step below is exact:
// the quadrant is floor(4t), the remainder f = 4t − q in [0, 1) is exact, and cos/sin of (π/2)·g is evaluated
// with g ≤ 1/2 by using 1 − f (also exact) in the upper half of the quadrant.
DDP_HOST_DEVICE inline double cos_two_pi(double t) {
  const double t4 = dmul(t, 4.0);  // exact (power of two)
  const int q = static_cast<int>(t4);
  const double f = dsub(t4, static_cast<double>(q));  // exact
  const bool upper = f > 0.5;
  const double g = upper ? dsub(1.0, f) : f;          // exact
  const double x = dmul(g, 0x1.921fb54442d18p+0);     // (π/2)·g, in [0, π/4]
  // cos(π/2·(q + f)): q = 0: cos(π/2 f); q = 1: −sin(π/2 f); q = 2: −cos(π/2 f); q = 3: sin(π/2 f).
  // With f = 1 − g in the upper half, cos(π/2 f) = sin(π/2 g) and sin(π/2 f) = cos(π/2 g).
  const bool want_cos_of_f = (q & 1) == 0;
  const double value = (want_cos_of_f != upper) ? cos_small(x) : sin_small(x);
  const bool negative = (q == 1) || (q == 2);
  return negative ? -value : value;
}

}  // namespace detail

// Philox-4x32-10 of the 128-bit counter (index_lo, index_hi, word2, word3) under the 64-bit key `seed`.
DDP_HOST_DEVICE inline Block philox4x32_10(std::uint64_t seed, std::uint64_t index, std::uint32_t word2,
                                           std::uint32_t word3) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u;
  constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(index);
  std::uint32_t c1 = static_cast<std::uint32_t>(index >> 32);
  std::uint32_t c2 = word2;
  std::uint32_t c3 = word3;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    detail::mulhilo32(kMul0, c0, &hi0, &lo0);
    detail::mulhilo32(kMul1, c2, &hi1, &lo1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0;
    const std::uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Block{{c0, c1, c2, c3}};
}

// The counter (index_lo, index_hi, stream, 0): the random fills' blocks.
DDP_HOST_DEVICE inline Block philox4x32_10(std::uint64_t seed, std::uint64_t index, StreamId stream) {
  return philox4x32_10(seed, index, static_cast<std::uint32_t>(stream), 0);
}

// A float in [0, 1) from the top 24 bits: exactly representable, so no rounding anywhere.
DDP_HOST_DEVICE inline float unit_float(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1.0p-24f;
}

// Element `index` of kernels::uniform(seed, ...): low + (high − low)·u with u in [0, 1). One correctly rounded
// fma, so it matches on every device; for u close to 1 the rounding can give exactly `high`, as in PyTorch.
DDP_HOST_DEVICE inline float uniform_at(std::uint64_t seed, std::uint64_t index, float low, float high) {
  const Block b = philox4x32_10(seed, index, StreamId::kUniform);
  return detail::ffma(detail::fsub(high, low), unit_float(b.v[0]), low);
}

// A standard normal value for `index` (Box–Muller, cosine branch), computed in double, rounded once to float.
// u1 in (0, 1) from 32 bits (never 0, so the log is finite: |z| ≤ sqrt(2·32·ln 2) ≈ 6.66), u2 in [0, 1).
DDP_HOST_DEVICE inline float standard_normal_at(std::uint64_t seed, std::uint64_t index) {
  const Block b = philox4x32_10(seed, index, StreamId::kNormal);
  const double u1 = detail::dmul(detail::dadd(static_cast<double>(b.v[0]), 0.5), 0x1.0p-32);  // exact
  const double u2 = detail::dmul(static_cast<double>(b.v[1]), 0x1.0p-32);                     // exact
  const double radius = detail::dsqrt(detail::dmul(-2.0, detail::log_positive(u1)));
  return static_cast<float>(detail::dmul(radius, detail::cos_two_pi(u2)));
}

// Element `index` of kernels::normal(seed, ...): mean + stddev·z with one correctly rounded fma.
DDP_HOST_DEVICE inline float normal_at(std::uint64_t seed, std::uint64_t index, float mean, float stddev) {
  return detail::ffma(stddev, standard_normal_at(seed, index), mean);
}

// Whether dropout keeps element `index` at draw `draw`: u ≥ p for u in [0, 1) from 24 bits (so P(keep) = 1 − p
// to 2^-24). Draws up to 2^56 are distinct.
DDP_HOST_DEVICE inline bool dropout_keeps(std::uint64_t seed, std::uint64_t draw, std::uint64_t index, float p) {
  const std::uint32_t word2 =
      static_cast<std::uint32_t>(StreamId::kDropout) | (static_cast<std::uint32_t>(draw >> 32) << 8);
  const Block b = philox4x32_10(seed, index, word2, static_cast<std::uint32_t>(draw));
  return unit_float(b.v[0]) >= p;
}

// SplitMix64: a replay buffer's draw of rows, row i of draw key k being splitmix64(k + i) modulo the samples held.
DDP_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace ddp::counter_rng
