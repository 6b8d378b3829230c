// optimizers.cu: SGD and AdamW against torch.optim's formulas, with the bf16 copy.
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

// The optimizers' bf16 copy must be exactly the round-to-nearest-even of every updated parameter.
void expect_bf16_copy(const std::vector<float>& params, const std::uint16_t* device_copy, const char* what) {
  std::vector<std::uint16_t> got(params.size());
  DDP_CUDA_CHECK(cudaMemcpy(got.data(), device_copy, got.size() * 2, cudaMemcpyDeviceToHost));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < params.size(); ++i) mismatches += got[i] != bf16_bits(params[i]);
  EXPECT_EQ(mismatches, 0u) << what << ": bf16 copy differs from the rounded parameters";
}

TEST_F(CudaKernels, SgdMatchesTorchFormula) {
  const std::int64_t n = 100003;
  const SgdParams configs[] = {
      {0.1f, 0.0f, 0.0f, 0.0f, false, false},    // plain
      {0.1f, 0.0f, 0.0f, 0.01f, false, false},   // weight decay
      {0.05f, 0.9f, 0.0f, 0.0f, false, true},    // momentum, first step
      {0.05f, 0.9f, 0.1f, 0.001f, false, false}, // momentum + dampening + wd
      {0.05f, 0.9f, 0.0f, 0.001f, true, false},  // nesterov
      {0.05f, 0.9f, 0.0f, 0.0f, true, true},     // nesterov, first step
  };
  for (const SgdParams& p : configs) {
    for (int misalign : {0, 1}) {
      const auto ph = random_nonzero(n, 91), gh = random_nonzero(n, 92), bh = random_nonzero(n, 93);
      DeviceBuffer pd((n + 1) * 4), gd((n + 1) * 4), bd((n + 1) * 4);
      float* param = pd.get<float>() + misalign;
      float* grad = gd.get<float>() + misalign;
      float* buf = bd.get<float>() + misalign;
      DDP_CUDA_CHECK(cudaMemcpy(param, ph.data(), n * 4, cudaMemcpyHostToDevice));
      DDP_CUDA_CHECK(cudaMemcpy(grad, gh.data(), n * 4, cudaMemcpyHostToDevice));
      if (p.first_step) {
        bd.poison();  // the first step must not read the buffer
      } else {
        DDP_CUDA_CHECK(cudaMemcpy(buf, bh.data(), n * 4, cudaMemcpyHostToDevice));
      }
      // The bf16 copy of mixed precision, written by the same pass; misaligned too (scalar stores).
      DeviceBuffer cd((n + 1) * 2);
      cd.poison();
      std::uint16_t* copy = cd.get<std::uint16_t>() + misalign;
      gpu::sgd_step(param, grad, p.momentum != 0.0f ? buf : nullptr, n, p, copy, stream_);
      sync();
      std::vector<float> pg(n), bg(n);
      DDP_CUDA_CHECK(cudaMemcpy(pg.data(), param, n * 4, cudaMemcpyDeviceToHost));
      expect_bf16_copy(pg, copy, "sgd");
      DDP_CUDA_CHECK(cudaMemcpy(bg.data(), buf, n * 4, cudaMemcpyDeviceToHost));
      std::vector<double> p_ref(n), b_ref(n);
      for (std::int64_t i = 0; i < n; ++i) {
        double g = gh[i];
        if (p.weight_decay != 0.0f) g += static_cast<double>(p.weight_decay) * ph[i];
        if (p.momentum != 0.0f) {
          const double b = p.first_step ? g : static_cast<double>(p.momentum) * bh[i] + (1.0 - p.dampening) * g;
          b_ref[i] = b;
          g = p.nesterov ? g + static_cast<double>(p.momentum) * b : b;
        }
        p_ref[i] = ph[i] - static_cast<double>(p.lr) * g;
      }
      const std::string what = "sgd lr=" + std::to_string(p.lr) + " momentum=" + std::to_string(p.momentum) +
                               " nesterov=" + std::to_string(p.nesterov) + " first=" + std::to_string(p.first_step);
      EXPECT_LT(rel_l2(std::vector<double>(pg.begin(), pg.end()), p_ref), 1e-6) << what;
      if (p.momentum != 0.0f) {
        EXPECT_LT(rel_l2(std::vector<double>(bg.begin(), bg.end()), b_ref), 1e-6) << what;
      }
    }
  }
}

TEST_F(CudaKernels, AdamWMatchesTorchFormula) {
  const std::int64_t n = 100003;
  for (std::int64_t step : {std::int64_t{1}, std::int64_t{10}, std::int64_t{1000}}) {
    for (int misalign : {0, 1}) {
      const AdamWParams p{1e-3, 0.9, 0.999, 1e-8, 0.01, step};  // doubles, as PyTorch's hyperparameters
      const auto ph = random_nonzero(n, 101), gh = random_nonzero(n, 102);
      auto mh = random_nonzero(n, 103, 0.1f), vh = random_nonzero(n, 104, 0.01f);
      for (auto& v : vh) v = std::abs(v);
      if (step == 1) {  // PyTorch's state starts at zero
        std::fill(mh.begin(), mh.end(), 0.0f);
        std::fill(vh.begin(), vh.end(), 0.0f);
      }
      DeviceBuffer pd((n + 1) * 4), gd((n + 1) * 4), md((n + 1) * 4), vd((n + 1) * 4);
      float* param = pd.get<float>() + misalign;
      float* grad = gd.get<float>() + misalign;
      float* m = md.get<float>() + misalign;
      float* v = vd.get<float>() + misalign;
      DDP_CUDA_CHECK(cudaMemcpy(param, ph.data(), n * 4, cudaMemcpyHostToDevice));
      DDP_CUDA_CHECK(cudaMemcpy(grad, gh.data(), n * 4, cudaMemcpyHostToDevice));
      DDP_CUDA_CHECK(cudaMemcpy(m, mh.data(), n * 4, cudaMemcpyHostToDevice));
      DDP_CUDA_CHECK(cudaMemcpy(v, vh.data(), n * 4, cudaMemcpyHostToDevice));
      DeviceBuffer cd((n + 1) * 2);
      cd.poison();
      std::uint16_t* copy = cd.get<std::uint16_t>() + misalign;
      gpu::adamw_step(param, grad, m, v, n, p, copy, stream_);
      sync();
      std::vector<float> pg(n), mg(n), vg(n);
      DDP_CUDA_CHECK(cudaMemcpy(pg.data(), param, n * 4, cudaMemcpyDeviceToHost));
      expect_bf16_copy(pg, copy, "adamw");
      DDP_CUDA_CHECK(cudaMemcpy(mg.data(), m, n * 4, cudaMemcpyDeviceToHost));
      DDP_CUDA_CHECK(cudaMemcpy(vg.data(), v, n * 4, cudaMemcpyDeviceToHost));
      const double bc1 = 1.0 - std::pow(0.9, static_cast<double>(step));
      const double bc2 = 1.0 - std::pow(0.999, static_cast<double>(step));
      std::vector<double> p_ref(n), m_ref(n), v_ref(n);
      for (std::int64_t i = 0; i < n; ++i) {
        double pp = ph[i] * (1.0 - 1e-3 * 0.01);
        const double mm = 0.9 * mh[i] + 0.1 * gh[i];
        const double vv = 0.999 * vh[i] + 0.001 * static_cast<double>(gh[i]) * gh[i];
        const double denom = std::sqrt(vv) / std::sqrt(bc2) + 1e-8;
        pp -= (1e-3 / bc1) * mm / denom;
        p_ref[i] = pp;
        m_ref[i] = mm;
        v_ref[i] = vv;
      }
      const std::string what = "adamw step=" + std::to_string(step) + " misalign=" + std::to_string(misalign);
      EXPECT_LT(rel_l2(std::vector<double>(pg.begin(), pg.end()), p_ref), 1e-6) << what;
      EXPECT_LT(rel_l2(std::vector<double>(mg.begin(), mg.end()), m_ref), 1e-6) << what;
      EXPECT_LT(rel_l2(std::vector<double>(vg.begin(), vg.end()), v_ref), 1e-6) << what;
    }
  }
}

}  // namespace
}  // namespace ddp::kernels::testing
