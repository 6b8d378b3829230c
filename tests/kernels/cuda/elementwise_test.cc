// elementwise.cu: fill, axpby and scale, add and mul (bit for bit with the CPU), casts, sum of squares.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/cuda/gemm_options.h"
#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"
#include "tests/kernels/cuda/kernel_test_support.h"

namespace ddp::kernels::testing {
namespace {

TEST_F(CudaKernels, FillEveryTypeWithoutOverrun) {
  const std::int64_t n = 1001;
  const double value = 3.14159265358979;
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kInt32, DType::kInt64}) {
    const std::size_t es = t == DType::kBFloat16 ? 2 : t == DType::kInt64 ? 8 : 4;
    for (int misalign : {0, 1}) {
      DeviceBuffer buf((n + 16) * es);
      buf.poison();
      char* start = buf.get<char>() + misalign * es;
      const double v = t == DType::kInt64 ? -1e12 : t == DType::kInt32 ? -7.0 : value;
      gpu::fill(t, start, n, v, stream_);
      sync();
      std::vector<unsigned char> bytes = download<unsigned char>(buf, (n + 16) * es);
      for (std::size_t i = 0; i < misalign * es; ++i) ASSERT_EQ(bytes[i], 0xff) << "fill wrote before the start";
      for (std::size_t i = (misalign + n) * es; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], 0xff) << "fill overran";
      const unsigned char* p = bytes.data() + misalign * es;
      for (std::int64_t i = 0; i < n; ++i) {
        if (t == DType::kFloat32) {
          float f;
          std::memcpy(&f, p + i * 4, 4);
          ASSERT_EQ(float_bits(f), float_bits(static_cast<float>(value)));
        } else if (t == DType::kBFloat16) {
          std::uint16_t b;
          std::memcpy(&b, p + i * 2, 2);
          ASSERT_EQ(b, bf16_bits(static_cast<float>(value)));
        } else if (t == DType::kInt32) {
          std::int32_t k;
          std::memcpy(&k, p + i * 4, 4);
          ASSERT_EQ(k, -7);
        } else {
          std::int64_t k;
          std::memcpy(&k, p + i * 8, 8);
          ASSERT_EQ(k, -1000000000000LL);
        }
      }
    }
  }
}

TEST_F(CudaKernels, AxpbyAndScale) {
  const std::int64_t n = 100003;
  const auto xh = random_nonzero(n, 51), yh = random_nonzero(n, 52);
  for (int misalign : {0, 1}) {
    DeviceBuffer xd((n + 1) * 4), yd((n + 1) * 4);
    float* x = xd.get<float>() + misalign;
    float* y = yd.get<float>() + misalign;
    DDP_CUDA_CHECK(cudaMemcpy(x, xh.data(), n * 4, cudaMemcpyHostToDevice));
    for (float beta : {0.0f, 0.5f}) {
      if (beta == 0.0f) {
        yd.poison();  // beta == 0 must not read y (NaN · 0 would be NaN)
      } else {
        DDP_CUDA_CHECK(cudaMemcpy(y, yh.data(), n * 4, cudaMemcpyHostToDevice));
      }
      gpu::axpby(x, y, n, -1.5f, beta, stream_);
      sync();
      std::vector<float> got(n);
      DDP_CUDA_CHECK(cudaMemcpy(got.data(), y, n * 4, cudaMemcpyDeviceToHost));
      std::vector<double> g(got.begin(), got.end()), ref(n);
      for (std::int64_t i = 0; i < n; ++i) ref[i] = -1.5 * xh[i] + (beta == 0.0f ? 0.0 : beta * yh[i]);
      EXPECT_LT(rel_l2(g, ref), 1e-6) << "axpby beta=" << beta << " misalign=" << misalign;
    }
    gpu::scale(x, n, 0.25f, stream_);
    sync();
    std::vector<float> got(n);
    DDP_CUDA_CHECK(cudaMemcpy(got.data(), x, n * 4, cudaMemcpyDeviceToHost));
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], xh[i] * 0.25f);  // exact: power-of-two scale
  }
}

// add and mul (with and without accumulation) give the CPU implementation's bits, on aligned and misaligned
// pointers (the vector and the scalar paths).
TEST_F(CudaKernels, AddAndMulEqualTheCpuBitwise) {
  const std::int64_t n = 100003;
  const auto ah = random_nonzero(n, 53), bh = random_nonzero(n, 54), yh = random_nonzero(n, 55);
  for (int misalign : {0, 1}) {
    DeviceBuffer ad((n + 1) * 4), bd((n + 1) * 4), yd((n + 1) * 4);
    float* a = ad.get<float>() + misalign;
    float* b = bd.get<float>() + misalign;
    float* y = yd.get<float>() + misalign;
    DDP_CUDA_CHECK(cudaMemcpy(a, ah.data(), n * 4, cudaMemcpyHostToDevice));
    DDP_CUDA_CHECK(cudaMemcpy(b, bh.data(), n * 4, cudaMemcpyHostToDevice));
    for (int kind = 0; kind < 3; ++kind) {  // add, mul, mul accumulating
      std::vector<float> want = yh;
      if (kind == 2) {
        DDP_CUDA_CHECK(cudaMemcpy(y, yh.data(), n * 4, cudaMemcpyHostToDevice));
      } else {
        yd.poison();  // overwritten without being read
      }
      if (kind == 0) {
        gpu::add(a, b, y, n, stream_);
        cpu::add(ah.data(), bh.data(), want.data(), n, nullptr);
      } else {
        gpu::mul(a, b, y, n, kind == 2, stream_);
        cpu::mul(ah.data(), bh.data(), want.data(), n, kind == 2, nullptr);
      }
      sync();
      std::vector<float> got(n);
      DDP_CUDA_CHECK(cudaMemcpy(got.data(), y, n * 4, cudaMemcpyDeviceToHost));
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * 4)) << "kind " << kind << " misalign " << misalign;
    }
  }
}

TEST_F(CudaKernels, FindNonfiniteEqualsTheCpu) {
  const std::int64_t rows = 3001, cols = 7;
  std::vector<float> x = random_nonzero(rows * cols, 56);
  const float inf = std::numeric_limits<float>::infinity();
  x[5 * cols + 3] = std::numeric_limits<float>::quiet_NaN();
  x[5 * cols + 1] = inf;  // two in one row: the first column is named
  x[100 * cols + 6] = -inf;
  x[(rows - 1) * cols] = std::numeric_limits<float>::quiet_NaN();
  x[7 * cols + 2] = std::numeric_limits<float>::max();             // large and tiny values are finite
  x[8 * cols + 4] = std::numeric_limits<float>::denorm_min();
  DeviceBuffer xd(rows * cols * 4), first(rows * 8);
  upload(xd, x);
  first.poison();
  gpu::find_nonfinite(xd.get<float>(), rows, cols, first.get<std::int64_t>(), stream_);
  sync();
  std::vector<std::int64_t> want(rows);
  cpu::find_nonfinite(x.data(), rows, cols, want.data(), nullptr);
  EXPECT_EQ(download<std::int64_t>(first, rows), want);
  EXPECT_EQ(want[5], 1);
  EXPECT_EQ(want[100], 6);
  EXPECT_EQ(want[rows - 1], 0);
  EXPECT_EQ(want[7], cols);
  EXPECT_EQ(want[8], cols);
}

TEST_F(CudaKernels, CastRoundsToNearestEven) {
  std::vector<float> src = random_nonzero(10007, 61, 100.0f);
  // Exact halfway cases with even and odd lower bf16 bits, tiny, huge and special values.
  const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00000001u,
                                    0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x3f800001u};
  for (std::uint32_t s : specials) {
    float f;
    std::memcpy(&f, &s, 4);
    src.push_back(f);
  }
  const std::int64_t n = static_cast<std::int64_t>(src.size());
  DeviceBuffer fd(n * 4), bd(n * 2), back(n * 4);
  upload(fd, src);
  for (int misalign : {0, 1}) {
    bd.poison();
    const std::int64_t m = n - misalign;
    gpu::cast(DType::kFloat32, fd.get<float>() + misalign, DType::kBFloat16,
              bd.get<std::uint16_t>() + misalign, m, stream_);
    sync();
    const auto bits = download<std::uint16_t>(bd, n);
    for (std::int64_t i = misalign; i < n; ++i) {
      const std::uint16_t want = bf16_bits(src[i]);
      if (std::isnan(src[i])) {
        ASSERT_TRUE(std::isnan(bf16_to_float(bits[i]))) << i;
      } else {
        ASSERT_EQ(bits[i], want) << "f32->bf16 at " << i << " value " << src[i];
      }
    }
  }
  back.poison();
  gpu::cast(DType::kBFloat16, bd.get(), DType::kFloat32, back.get(), n, stream_);
  sync();
  const auto bits = download<std::uint16_t>(bd, n);
  const auto f = download<float>(back, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = bf16_to_float(bits[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f[i]));
    } else {
      ASSERT_EQ(float_bits(f[i]), float_bits(want)) << "bf16->f32 at " << i;
    }
  }
}

TEST_F(CudaKernels, SumSquaresIsAccurateAndDeterministic) {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{5}, std::int64_t{(1 << 22) + 3}}) {
    for (int misalign : {0, 1}) {
      const auto xh = random_nonzero(n, 71, 10.0f);
      DeviceBuffer xd((n + 1) * 4), out(8);
      float* x = xd.get<float>() + misalign;
      DDP_CUDA_CHECK(cudaMemcpy(x, xh.data(), n * 4, cudaMemcpyHostToDevice));
      out.poison();
      gpu::sum_squares(x, n, out.get<double>(), stream_);
      sync();
      const double got = download<double>(out, 1)[0];
      double ref = 0.0;
      for (float v : xh) ref += static_cast<double>(v) * v;
      EXPECT_NEAR(got, ref, 1e-12 * ref) << "n=" << n;
      for (int i = 0; i < 3; ++i) {
        gpu::sum_squares(x, n, out.get<double>(), stream_);
        sync();
        const double again = download<double>(out, 1)[0];
        EXPECT_EQ(std::memcmp(&got, &again, 8), 0) << "sum_squares not deterministic, n=" << n;
      }
    }
  }
}

}  // namespace
}  // namespace ddp::kernels::testing
