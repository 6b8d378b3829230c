// activations.cu: the standalone activations, out of place and in place.
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

TEST_F(CudaKernels, ActivationsMatchReference) {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000003}}) {
    for (int misalign : {0, 1}) {
      DeviceBuffer xd((n + 1) * 4), yd((n + 1) * 4), dyd((n + 1) * 4), dxd((n + 1) * 4);
      float* x = xd.get<float>() + misalign;
      float* y = yd.get<float>() + misalign;
      float* dy = dyd.get<float>() + misalign;
      float* dx = dxd.get<float>() + misalign;
      const auto xh = random_nonzero(n, 21, 3.0f), dyh = random_nonzero(n, 22), dx0 = random_nonzero(n, 23);
      DDP_CUDA_CHECK(cudaMemcpy(x, xh.data(), n * 4, cudaMemcpyHostToDevice));
      DDP_CUDA_CHECK(cudaMemcpy(dy, dyh.data(), n * 4, cudaMemcpyHostToDevice));
      for (Activation act : kActivations) {
        yd.poison();
        gpu::activation_forward(act, x, y, n, stream_);
        for (bool accumulate : {false, true}) {
          if (accumulate) {
            DDP_CUDA_CHECK(cudaMemcpy(dx, dx0.data(), n * 4, cudaMemcpyHostToDevice));
          } else {
            dxd.poison();
          }
          gpu::activation_backward(act, x, y, dy, dx, n, accumulate, stream_);
          sync();
          std::vector<float> dxh(n);
          DDP_CUDA_CHECK(cudaMemcpy(dxh.data(), dx, n * 4, cudaMemcpyDeviceToHost));
          std::vector<double> got(dxh.begin(), dxh.end()), ref(n);
          for (std::int64_t i = 0; i < n; ++i)
            ref[i] = (accumulate ? dx0[i] : 0.0) + dyh[i] * act_grad_ref(act, xh[i]);
          EXPECT_LT(rel_l2(got, ref), 1e-6) << "activation_backward " << act_name(act) << " n=" << n
                                            << " misalign=" << misalign << " accumulate=" << accumulate;
        }
        std::vector<float> yh(n);
        DDP_CUDA_CHECK(cudaMemcpy(yh.data(), y, n * 4, cudaMemcpyDeviceToHost));
        std::vector<double> got(yh.begin(), yh.end()), ref(n);
        for (std::int64_t i = 0; i < n; ++i) ref[i] = act_ref(act, xh[i]);
        EXPECT_LT(rel_l2(got, ref), 1e-6) << "activation_forward " << act_name(act) << " n=" << n
                                          << " misalign=" << misalign;
      }
    }
  }
}

TEST_F(CudaKernels, ActivationsInPlace) {
  const std::int64_t n = 4099;
  DeviceBuffer buf(n * 4);
  const auto xh = random_nonzero(n, 31, 2.0f);
  upload(buf, xh);
  gpu::activation_forward(Activation::kGelu, buf.get<float>(), buf.get<float>(), n, stream_);
  sync();
  const auto yh = download<float>(buf, n);
  std::vector<double> got(yh.begin(), yh.end()), ref(n);
  for (std::int64_t i = 0; i < n; ++i) ref[i] = gelu_ref(xh[i]);
  EXPECT_LT(rel_l2(got, ref), 1e-6);
}

}  // namespace
}  // namespace ddp::kernels::testing
