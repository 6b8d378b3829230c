// layers.cu: the MLP family's kernels against their CPU twins on the same inputs: the embedding's gather and
// in-order scatter-add, dropout's mask, category ids and column copies bit for bit; LayerNorm (whose weight and
// bias gradients sum in chunks of rows) and the frequency encoding to float rounding, and the same bits when run
// twice.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "tests/kernels/cuda/kernel_test_support.h"

namespace ddp::kernels::testing {
namespace {

namespace host = ::ddp::kernels::cpu;

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST_F(CudaKernels, EmbeddingGatherAndScatterAddAreTheCpusBits) {
  const std::int64_t num = 37, dim = 19, n = 1001;
  const std::vector<float> weight = random_nonzero(num * dim, 1), dy = random_nonzero(n * dim, 2);
  std::vector<std::int32_t> ids(n);
  for (std::int64_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>((i * 13) % (num + 2)) - 1;  // -1 .. num
  DeviceBuffer w(num * dim * 4), g(n * dim * 4), idx(n * 4), y(n * dim * 4), dw(num * dim * 4);
  upload(w, weight);
  upload(g, dy);
  upload(idx, ids);
  for (bool accumulate : {false, true}) {
    y.poison();
    upload(dw, weight);  // the old gradient to accumulate into
    gpu::embedding_forward(w.get<float>(), num, dim, idx.get<std::int32_t>(), n, y.get<float>(), stream_);
    gpu::embedding_backward(g.get<float>(), idx.get<std::int32_t>(), n, num, dim, dw.get<float>(), accumulate,
                            stream_);
    sync();
    std::vector<float> want_y(n * dim), want_dw = weight;
    host::embedding_forward(weight.data(), num, dim, ids.data(), n, want_y.data(), nullptr);
    host::embedding_backward(dy.data(), ids.data(), n, num, dim, want_dw.data(), accumulate, nullptr);
    EXPECT_EQ(download<float>(y, n * dim), want_y);
    EXPECT_EQ(download<float>(dw, num * dim), want_dw) << (accumulate ? "accumulating" : "overwriting");
  }
}

TEST_F(CudaKernels, DropoutMasksAreTheCpusForEachDraw) {
  const std::int64_t n = 100003;
  const std::vector<float> x = random_nonzero(n, 3);
  DeviceBuffer xd(n * 4), y(n * 4), mask(n * 4), draw(8);
  upload(xd, x);
  const float p = 0.35f, scale = static_cast<float>(1.0 / (1.0 - 0.35));
  for (std::int64_t d : {std::int64_t{0}, std::int64_t{7}, (std::int64_t{1} << 40) + 3}) {
    upload(draw, std::vector<std::int64_t>{d});
    y.poison();
    mask.poison();
    gpu::dropout_forward(xd.get<float>(), n, p, scale, 99, draw.get<std::int64_t>(), y.get<float>(),
                         mask.get<float>(), stream_);
    gpu::advance_counter(draw.get<std::int64_t>(), 5, stream_);
    sync();
    std::vector<float> want_y(n), want_mask(n);
    host::dropout_forward(x.data(), n, p, scale, 99, &d, want_y.data(), want_mask.data(), nullptr);
    EXPECT_EQ(download<float>(y, n), want_y) << "draw " << d;
    EXPECT_EQ(download<float>(mask, n), want_mask) << "draw " << d;
    EXPECT_EQ(download<std::int64_t>(draw, 1)[0], d + 5);
  }
}

TEST_F(CudaKernels, CategoryIdsAndColumnCopiesAreTheCpusBits) {
  const std::int64_t rows = 513, cols = 7;
  std::vector<float> x = random_nonzero(rows * cols, 4);
  for (std::int64_t r = 0; r < rows; ++r) x[r * cols + 2] = static_cast<float>(r % 9) - (r % 5 == 0 ? 0.5f : 0.0f);
  DeviceBuffer xd(rows * cols * 4), ids(rows * 4), dst(rows * 10 * 4);
  upload(xd, x);
  ids.poison();
  gpu::float_column_to_index(xd.get<float>(), rows, cols, 2, 7, ids.get<std::int32_t>(), stream_);
  std::vector<float> before = random_nonzero(rows * 10, 5);
  upload(dst, before);
  gpu::copy_columns(xd.get<float>() + 1, cols, dst.get<float>() + 3, 10, rows, 4, true, stream_);
  sync();
  std::vector<std::int32_t> want_ids(rows);
  host::float_column_to_index(x.data(), rows, cols, 2, 7, want_ids.data(), nullptr);
  EXPECT_EQ(download<std::int32_t>(ids, rows), want_ids);
  host::copy_columns(x.data() + 1, cols, before.data() + 3, 10, rows, 4, true, nullptr);
  EXPECT_EQ(download<float>(dst, rows * 10), before);
}

TEST_F(CudaKernels, LayerNormMatchesTheCpuAndRepeatsItsBits) {
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{7, 1}, {129, 300}, {5000, 33}}) {
    const std::vector<float> x = random_nonzero(rows * cols, 6, 3.0f), w = random_nonzero(cols, 7),
                             b = random_nonzero(cols, 8), dy = random_nonzero(rows * cols, 9);
    DeviceBuffer xd(rows * cols * 4), wd(cols * 4), bd(cols * 4), g(rows * cols * 4), y(rows * cols * 4),
        mean(rows * 4), rstd(rows * 4), dx(rows * cols * 4), dw(cols * 4), db(cols * 4);
    upload(xd, x);
    upload(wd, w);
    upload(bd, b);
    upload(g, dy);
    std::vector<float> first_dw;
    for (int run = 0; run < 2; ++run) {
      for (const DeviceBuffer* d : {&y, &mean, &rstd, &dx, &dw, &db}) d->poison();
      gpu::layer_norm_forward(xd.get<float>(), wd.get<float>(), bd.get<float>(), rows, cols, 1e-5f, y.get<float>(),
                              mean.get<float>(), rstd.get<float>(), stream_);
      gpu::layer_norm_backward(g.get<float>(), xd.get<float>(), wd.get<float>(), mean.get<float>(),
                               rstd.get<float>(), rows, cols, dx.get<float>(), false, dw.get<float>(), false,
                               db.get<float>(), false, stream_);
      sync();
      std::vector<float> hy(rows * cols), hmean(rows), hrstd(rows), hdx(rows * cols), hdw(cols), hdb(cols);
      host::layer_norm_forward(x.data(), w.data(), b.data(), rows, cols, 1e-5f, hy.data(), hmean.data(),
                               hrstd.data(), nullptr);
      host::layer_norm_backward(dy.data(), x.data(), w.data(), hmean.data(), hrstd.data(), rows, cols, hdx.data(),
                                false, hdw.data(), false, hdb.data(), false, nullptr);
      EXPECT_LT(rel_l2(widen(download<float>(y, rows * cols)), widen(hy)), 1e-6) << rows << "x" << cols;
      EXPECT_LT(rel_l2(widen(download<float>(dx, rows * cols)), widen(hdx)), 1e-5) << rows << "x" << cols;
      EXPECT_LT(rel_l2(widen(download<float>(dw, cols)), widen(hdw)), 1e-5) << rows << "x" << cols;
      EXPECT_LT(rel_l2(widen(download<float>(db, cols)), widen(hdb)), 1e-5) << rows << "x" << cols;
      if (run == 0) {
        first_dw = download<float>(dw, cols);
      } else {
        EXPECT_EQ(download<float>(dw, cols), first_dw) << "the same bits on a second run";
      }
    }
  }
}

TEST_F(CudaKernels, FrequencyEncodingMatchesTheCpu) {
  const std::int64_t rows = 301, in = 3, frequencies = 8, out = in * (1 + 2 * frequencies);
  const std::vector<float> x = random_nonzero(rows * in, 10), dy = random_nonzero(rows * out, 11);
  DeviceBuffer xd(rows * in * 4), y(rows * out * 4), g(rows * out * 4), dx(rows * in * 4);
  upload(xd, x);
  upload(g, dy);
  y.poison();
  dx.poison();
  gpu::frequency_encoding_forward(xd.get<float>(), rows, in, frequencies, true, y.get<float>(), stream_);
  gpu::frequency_encoding_backward(xd.get<float>(), g.get<float>(), rows, in, frequencies, true, dx.get<float>(), false,
                                   stream_);
  sync();
  std::vector<float> hy(rows * out), hdx(rows * in);
  host::frequency_encoding_forward(x.data(), rows, in, frequencies, true, hy.data(), nullptr);
  host::frequency_encoding_backward(x.data(), dy.data(), rows, in, frequencies, true, hdx.data(), false, nullptr);
  EXPECT_LT(rel_l2(widen(download<float>(y, rows * out)), widen(hy)), 1e-6);
  EXPECT_LT(rel_l2(widen(download<float>(dx, rows * in)), widen(hdx)), 1e-6);
}

}  // namespace
}  // namespace ddp::kernels::testing
