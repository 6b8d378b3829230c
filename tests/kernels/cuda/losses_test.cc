// losses.cu: softmax cross-entropy, mse, argmax and count_correct, and one-launch reductions in sequence.
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

// float32 or bfloat16 logits (mixed precision): the loss is computed in float32 from the logits as stored, the
// gradient is stored in the logits' type (bf16: within its rounding, 2^-9 relative).
void check_softmax_xent(std::int64_t batch, std::int64_t classes, float offset, cudaStream_t stream,
                        DType dtype) {
  auto logits = random_nonzero(batch * classes, static_cast<std::uint32_t>(batch + classes), 4.0f);
  for (auto& v : logits) v += offset;  // a large common offset: only a max-subtracting kernel survives it
  std::vector<std::int32_t> labels(batch);
  std::mt19937 rng(5);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng() % classes);
  TypedBuffer ld(dtype, logits.size()), grad(dtype, logits.size());
  DeviceBuffer lab(batch * 4), loss(4);
  ld.set(logits);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(ld.host[i]);  // as stored
  upload(lab, labels);
  const double grad_tol = dtype == DType::kFloat32 ? 1e-5 : 1e-2;
  double loss_ref = 0.0;
  std::vector<double> grad_ref(logits.size());
  for (std::int64_t r = 0; r < batch; ++r) {
    double m = -INFINITY;
    for (std::int64_t c = 0; c < classes; ++c) m = std::max(m, static_cast<double>(logits[r * classes + c]));
    double s = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(logits[r * classes + c] - m);
    loss_ref += std::log(s) + m - logits[r * classes + labels[r]];
    for (std::int64_t c = 0; c < classes; ++c)
      grad_ref[r * classes + c] =
          (std::exp(logits[r * classes + c] - m) / s - (c == labels[r] ? 1.0 : 0.0)) / static_cast<double>(batch);
  }
  loss_ref /= static_cast<double>(batch);
  const char* type = dtype == DType::kFloat32 ? "fp32" : "bf16";
  for (bool with_grad : {true, false}) {
    loss.poison();
    grad.device.poison();
    gpu::softmax_cross_entropy(dtype, ld.device.get(), lab.get<std::int32_t>(), batch, classes, loss.get<float>(),
                               with_grad ? grad.device.get() : nullptr, stream);
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    const float got = download<float>(loss, 1)[0];
    EXPECT_NEAR(got, loss_ref, 1e-5 * std::max(1.0, std::abs(loss_ref)))
        << "softmax_cross_entropy loss " << type << " batch=" << batch << " classes=" << classes
        << " offset=" << offset;
    if (with_grad) {
      EXPECT_LT(rel_l2(grad.fetch(), grad_ref), grad_tol)
          << "softmax_cross_entropy dlogits " << type << " batch=" << batch << " classes=" << classes;
    }
  }
  // Deterministic: the same inputs give the same bits.
  gpu::softmax_cross_entropy(dtype, ld.device.get(), lab.get<std::int32_t>(), batch, classes, loss.get<float>(),
                             nullptr, stream);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  const float first = download<float>(loss, 1)[0];
  for (int i = 0; i < 3; ++i) {
    gpu::softmax_cross_entropy(dtype, ld.device.get(), lab.get<std::int32_t>(), batch, classes, loss.get<float>(),
                               nullptr, stream);
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(float_bits(first), float_bits(download<float>(loss, 1)[0]));
  }
}

namespace {


TEST_F(CudaKernels, SoftmaxCrossEntropyMatchesReference) {
  check_softmax_xent(37, 10, 0.0f, stream_);
  check_softmax_xent(256, 10, 0.0f, stream_);
  check_softmax_xent(1000, 1000, 0.0f, stream_);
  check_softmax_xent(20000, 33, 0.0f, stream_);  // more rows than the partials: grid-stride rows
  check_softmax_xent(64, 17, 1000.0f, stream_);
  // Rows of a multiple of 8 classes take the 16-byte path; bfloat16 logits (forward_bf16's) both ways.
  check_softmax_xent(96, 4096, 0.0f, stream_);
  check_softmax_xent(96, 4096, 0.0f, stream_, DType::kBFloat16);
  check_softmax_xent(256, 10, 0.0f, stream_, DType::kBFloat16);
  check_softmax_xent(64, 1000, 100.0f, stream_, DType::kBFloat16);
}

TEST_F(CudaKernels, MseMatchesReference) {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{1000003}}) {
    const auto p = random_nonzero(n, 41), t = random_nonzero(n, 42);
    DeviceBuffer pd(n * 4), td(n * 4), loss(4), grad(n * 4);
    upload(pd, p);
    upload(td, t);
    loss.poison();
    grad.poison();
    gpu::mse_loss(pd.get<float>(), td.get<float>(), n, loss.get<float>(), grad.get<float>(), stream_);
    sync();
    double ref = 0.0;
    std::vector<double> gref(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(p[i]) - t[i];
      ref += d * d;
      gref[i] = 2.0 * d / static_cast<double>(n);
    }
    ref /= static_cast<double>(n);
    EXPECT_NEAR(download<float>(loss, 1)[0], ref, 1e-5 * ref) << "mse n=" << n;
    const auto g = download<float>(grad, n);
    EXPECT_LT(rel_l2(std::vector<double>(g.begin(), g.end()), gref), 1e-6) << "mse grad n=" << n;
  }
}

TEST_F(CudaKernels, ArgmaxAndCountCorrectBreakTiesLow) {
  for (std::int64_t classes : {std::int64_t{1}, std::int64_t{10}, std::int64_t{77}}) {
    const std::int64_t batch = 5003;
    std::mt19937 rng(static_cast<std::uint32_t>(classes));
    std::vector<float> logits(batch * classes);
    for (auto& v : logits) v = static_cast<float>(rng() % 4);  // many ties
    std::vector<std::int32_t> labels(batch);
    for (auto& l : labels) l = static_cast<std::int32_t>(rng() % classes);
    std::vector<std::int32_t> arg_ref(batch);
    std::int64_t correct_ref = 0;
    for (std::int64_t r = 0; r < batch; ++r) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < classes; ++c)
        if (logits[r * classes + c] > logits[r * classes + best]) best = c;
      arg_ref[r] = static_cast<std::int32_t>(best);
      correct_ref += best == labels[r] ? 1 : 0;
    }
    DeviceBuffer ld(logits.size() * 4), lab(batch * 4), arg(batch * 4), correct(8);
    upload(ld, logits);
    upload(lab, labels);
    arg.poison();
    correct.poison();
    gpu::argmax_rows(ld.get<float>(), batch, classes, arg.get<std::int32_t>(), stream_);
    gpu::count_correct(ld.get<float>(), lab.get<std::int32_t>(), batch, classes, correct.get<std::int64_t>(),
                       stream_);
    sync();
    EXPECT_EQ(download<std::int32_t>(arg, batch), arg_ref) << "classes=" << classes;
    EXPECT_EQ(download<std::int64_t>(correct, 1)[0], correct_ref) << "classes=" << classes;
  }
}

}  // namespace
}  // namespace ddp::kernels::testing
