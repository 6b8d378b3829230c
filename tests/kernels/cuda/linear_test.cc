// linear.cu and narrow_linear.cu: forward and backward on cuBLASLt and the narrow kernels, every type
// combination, misaligned views, no allocation in steady state, graph capture.
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

struct LinearCase {
  DType dtype;  // x and w (and dx, dz)
  MathMode math;
  LinearShape shape;
  // Mixed precision (LinearTypes): y/bias/dy and dw/dbias types; the input type when left unset.
  DType out = DType::kInt32;
  DType grad = DType::kInt32;
  DType out_type() const { return out == DType::kInt32 ? dtype : out; }
  DType grad_type() const { return grad == DType::kInt32 ? dtype : grad; }
  LinearTypes types() const { return LinearTypes(dtype, out_type(), grad_type()); }
};

double linear_tolerance(const LinearCase& c) {
  if (c.dtype == DType::kBFloat16) return 2e-2;
  return c.math == MathMode::kTF32 ? 5e-3 : 1e-5;
}

std::string describe(const LinearCase& c, Activation act, bool bias, bool accumulate) {
  auto name = [](DType t) { return t == DType::kBFloat16 ? "bf16" : "fp32"; };
  return std::string(c.dtype == DType::kBFloat16 ? "bf16" : c.math == MathMode::kTF32 ? "tf32" : "fp32") +
         (c.out_type() != c.dtype || c.grad_type() != c.dtype
              ? std::string(" out=") + name(c.out_type()) + " grad=" + name(c.grad_type())
              : std::string()) +
         " batch=" + std::to_string(c.shape.batch) + " in=" + std::to_string(c.shape.in) +
         " out=" + std::to_string(c.shape.out) + " act=" + act_name(act) + (bias ? " bias" : " no-bias") +
         (accumulate ? " accumulate" : " overwrite");
}

std::vector<LinearCase> linear_cases(bool include_large) {
  std::vector<LinearCase> cases;
  // {1000, 40, 264}: the bias gradient over 125 row chunks and a partial column tile (the vectorised reduction
  // with its last-block finish); {64, 32, 16}: one chunk. Layers of at most 32 outputs run on the narrow kernels
  // (narrow_linear.h): {128, 512, 10} is the main job's head, {129, 70, 32} the widest narrow layer with a
  // partial column block, a partial row chunk and rows not a multiple of four; {2000, 64, 10} is narrow forward
  // but too many rows for the narrow backward (cuBLASLt).
  const std::vector<LinearShape> shapes =
      include_large
          ? std::vector<LinearShape>{{37, 129, 67}, {1, 3, 5}, {256, 784, 1024}, {2000, 64, 10}}
          : std::vector<LinearShape>{{37, 129, 67}, {1, 3, 5}, {64, 32, 16}, {1000, 40, 264}, {128, 512, 10},
                                     {129, 70, 32}};
  for (const auto& s : shapes) {
    cases.push_back({DType::kFloat32, MathMode::kFloat32, s});
    cases.push_back({DType::kFloat32, MathMode::kTF32, s});
    cases.push_back({DType::kBFloat16, MathMode::kFloat32, s});
    // linear_mixed's two shapes: float32 gradients for the FP32 masters, with a bf16 or a float32 output.
    cases.push_back({DType::kBFloat16, MathMode::kFloat32, s, DType::kBFloat16, DType::kFloat32});
    cases.push_back({DType::kBFloat16, MathMode::kFloat32, s, DType::kFloat32, DType::kFloat32});
  }
  return cases;
}

void run_linear_forward_case(const LinearCase& c, Activation act, bool with_bias, cudaStream_t stream) {
  const std::int64_t B = c.shape.batch, I = c.shape.in, O = c.shape.out;
  const std::uint32_t seed = static_cast<std::uint32_t>(B * 7919 + I * 31 + O);
  TypedBuffer x(c.dtype, B * I), w(c.dtype, O * I), bias(c.out_type(), O), y(c.out_type(), B * O),
      pre(c.out_type(), B * O);
  x.set(random_nonzero(B * I, seed + 1));
  // Scale the weights like PyTorch's init so pre-activations stay O(1) and GELU/ReLU see both signs.
  w.set(random_nonzero(O * I, seed + 2, 1.0f / std::sqrt(static_cast<float>(I))));
  bias.set(random_nonzero(O, seed + 3, 0.5f));
  y.device.poison();
  pre.device.poison();
  const bool want_pre = act == Activation::kGelu;
  gpu::linear_forward(c.types(), c.math, c.shape, x.device.get(), w.device.get(),
                      with_bias ? bias.device.get() : nullptr, act, y.device.get(),
                      want_pre ? pre.device.get() : nullptr, stream);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<double> z_ref(B * O), y_ref(B * O);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t o = 0; o < O; ++o) {
      double s = with_bias ? bias.host[o] : 0.0;
      for (std::int64_t i = 0; i < I; ++i) s += x.host[b * I + i] * w.host[o * I + i];
      z_ref[b * O + o] = s;
      y_ref[b * O + o] = act_ref(act, s);
    }
  }
  const double tol = linear_tolerance(c);
  const std::string what = describe(c, act, with_bias, false);
  EXPECT_LT(rel_l2(y.fetch(), y_ref), tol) << "forward y, " << what;
  if (want_pre) {
    EXPECT_LT(rel_l2(pre.fetch(), z_ref), tol) << "forward pre_activation, " << what;
  }
}

void run_linear_backward_case(const LinearCase& c, Activation act, bool with_bias, bool accumulate, bool with_dx,
                              cudaStream_t stream) {
  const std::int64_t B = c.shape.batch, I = c.shape.in, O = c.shape.out;
  const std::uint32_t seed = static_cast<std::uint32_t>(B * 104729 + I * 17 + O * 3);
  TypedBuffer x(c.dtype, B * I), w(c.dtype, O * I), dy(c.out_type(), B * O), y(c.out_type(), B * O),
      pre(c.out_type(), B * O);
  TypedBuffer dx(c.dtype, B * I), dw(c.grad_type(), O * I), dbias(c.grad_type(), O), scratch(c.dtype, B * O);
  x.set(random_nonzero(B * I, seed + 1));
  w.set(random_nonzero(O * I, seed + 2, 1.0f / std::sqrt(static_cast<float>(I))));
  dy.set(random_nonzero(B * O, seed + 3));
  // The saved activation tensors, consistent with each other: y = act(pre).
  const std::vector<float> pre_values = random_nonzero(B * O, seed + 4, 2.0f);
  pre.set(pre_values);
  std::vector<float> y_values(B * O);
  for (std::size_t i = 0; i < y_values.size(); ++i) y_values[i] = static_cast<float>(act_ref(act, pre.host[i]));
  y.set(y_values);
  if (accumulate) {
    dw.set(random_nonzero(O * I, seed + 5));
    dbias.set(random_nonzero(O, seed + 6));
  } else {
    dw.device.poison();
    dbias.device.poison();
  }
  dx.device.poison();
  scratch.device.poison();
  const std::vector<double> dw0 = dw.host, db0 = dbias.host;

  const bool needs_dz = act != Activation::kNone || c.out_type() != c.dtype;
  gpu::linear_backward(c.types(), c.math, c.shape, dy.device.get(), x.device.get(), w.device.get(), y.device.get(),
                       pre.device.get(), act, with_dx ? dx.device.get() : nullptr, dw.device.get(),
                       with_bias ? dbias.device.get() : nullptr, accumulate, needs_dz ? scratch.device.get() : nullptr,
                       stream);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<double> dz(B * O);
  for (std::int64_t i = 0; i < B * O; ++i) {
    const double saved = act == Activation::kRelu ? y.host[i] : pre.host[i];
    dz[i] = dy.host[i] * act_grad_ref(act, saved);
  }
  std::vector<double> dx_ref(B * I, 0.0), dw_ref(O * I), db_ref(O);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < I; ++i) {
      double s = 0.0;
      for (std::int64_t o = 0; o < O; ++o) s += dz[b * O + o] * w.host[o * I + i];
      dx_ref[b * I + i] = s;
    }
  // Row-by-row accumulation keeps the reference cache-friendly for the 256x784x1024 case.
  for (std::int64_t j = 0; j < O * I; ++j) dw_ref[j] = accumulate ? dw0[j] : 0.0;
  for (std::int64_t o = 0; o < O; ++o) db_ref[o] = accumulate ? db0[o] : 0.0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t o = 0; o < O; ++o) {
      const double g = dz[b * O + o];
      db_ref[o] += g;
      const double* xr = &x.host[b * I];
      double* dwr = &dw_ref[o * I];
      for (std::int64_t i = 0; i < I; ++i) dwr[i] += g * xr[i];
    }
  const double tol = linear_tolerance(c);
  const std::string what = describe(c, act, with_bias, accumulate) + (with_dx ? "" : " no-dx");
  if (with_dx) {
    EXPECT_LT(rel_l2(dx.fetch(), dx_ref), tol) << "backward dx, " << what;
  }
  EXPECT_LT(rel_l2(dw.fetch(), dw_ref), tol) << "backward dw, " << what;
  if (with_bias) {
    EXPECT_LT(rel_l2(dbias.fetch(), db_ref), tol) << "backward dbias, " << what;
  }
  if (needs_dz) {
    EXPECT_LT(rel_l2(scratch.fetch(), dz), tol) << "backward scratch_dz, " << what;
  }
}

TEST_F(CudaKernels, LinearForwardMatchesReference) {
  for (const auto& c : linear_cases(true))
    for (Activation act : kActivations)
      for (bool bias : {false, true}) run_linear_forward_case(c, act, bias, stream_);
}

TEST_F(CudaKernels, LinearBackwardMatchesReference) {
  for (const auto& c : linear_cases(false))
    for (Activation act : kActivations)
      for (bool bias : {false, true})
        for (bool accumulate : {false, true}) run_linear_backward_case(c, act, bias, accumulate, true, stream_);
}

// The narrow layers' shapes through cuBLASLt (GemmOptions::narrow_layers off).
TEST_F(CudaKernels, NarrowLayersThroughCublasLtMatchReference) {
  const gpu::GemmOptions saved = gpu::gemm_options();
  gpu::GemmOptions o = saved;
  o.narrow_layers = false;
  gpu::set_gemm_options(o);
  for (const auto& c : linear_cases(false)) {
    if (c.shape.out > 32) continue;
    for (Activation act : kActivations) {
      run_linear_forward_case(c, act, true, stream_);
      for (bool accumulate : {false, true}) run_linear_backward_case(c, act, true, accumulate, true, stream_);
    }
  }
  gpu::set_gemm_options(saved);
}

TEST_F(CudaKernels, LinearBackwardLargeMatchesReference) {
  for (const auto& c : linear_cases(true)) {
    if (c.shape.batch != 256 && c.shape.batch != 2000) continue;
    for (Activation act : kActivations)
      for (bool accumulate : {false, true}) run_linear_backward_case(c, act, true, accumulate, true, stream_);
  }
}

TEST_F(CudaKernels, LinearBackwardWithoutDx) {
  const LinearCase c{DType::kFloat32, MathMode::kFloat32, {37, 129, 67}};
  for (Activation act : kActivations) run_linear_backward_case(c, act, true, false, false, stream_);
}

// Views into a flat parameter buffer are not 256-byte aligned; cuBLASLt must be told, not assume it.
TEST_F(CudaKernels, LinearForwardOnMisalignedViews) {
  // A wide layer (cuBLASLt) and a narrow one (narrow_linear.h, whose four-wide loads need aligned rows).
  for (const LinearShape s : {LinearShape{37, 129, 67}, LinearShape{37, 129, 10}}) {
    const std::int64_t B = s.batch, I = s.in, O = s.out;
    DeviceBuffer flat((B * I + O * I + O + B * O + 16) * sizeof(float));
    float* base = flat.get<float>();
    float* x = base + 1;  // 4-byte aligned only
    float* w = x + B * I;
    float* bias = w + O * I;
    float* y = bias + O + 1;
    const auto xh = random_nonzero(B * I, 11), wh = random_nonzero(O * I, 12, 0.1f), bh = random_nonzero(O, 13);
    DDP_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
    DDP_CUDA_CHECK(cudaMemcpy(w, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice));
    DDP_CUDA_CHECK(cudaMemcpy(bias, bh.data(), bh.size() * 4, cudaMemcpyHostToDevice));
    DDP_CUDA_CHECK(cudaMemset(y, 0xff, B * O * 4));
    gpu::linear_forward(DType::kFloat32, MathMode::kFloat32, s, x, w, bias, Activation::kRelu, y, nullptr,
                        stream_);
    sync();
    std::vector<float> yh(B * O);
    DDP_CUDA_CHECK(cudaMemcpy(yh.data(), y, yh.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> got(yh.begin(), yh.end()), ref(B * O);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t o = 0; o < O; ++o) {
        double z = bh[o];
        for (std::int64_t i = 0; i < I; ++i) z += static_cast<double>(xh[b * I + i]) * wh[o * I + i];
        ref[b * O + o] = z > 0 ? z : 0;
      }
    EXPECT_LT(rel_l2(got, ref), 1e-5) << "misaligned y, out=" << O;

    // Backward with the same misaligned views: dy = y, dbias misaligned (no BGRADB epilogue), dw and dx views.
    DeviceBuffer grads((O * I + O + B * I + 16) * sizeof(float));
    float* dw = grads.get<float>() + 1;
    float* dbias = dw + O * I;
    float* dx = dbias + O + 1;
    grads.poison();
    gpu::linear_backward(DType::kFloat32, MathMode::kFloat32, s, y, x, w, nullptr, nullptr, Activation::kNone,
                         dx, dw, dbias, false, nullptr, stream_);
    sync();
    std::vector<float> dwh(O * I), dbh(O), dxh(B * I);
    DDP_CUDA_CHECK(cudaMemcpy(dwh.data(), dw, dwh.size() * 4, cudaMemcpyDeviceToHost));
    DDP_CUDA_CHECK(cudaMemcpy(dbh.data(), dbias, dbh.size() * 4, cudaMemcpyDeviceToHost));
    DDP_CUDA_CHECK(cudaMemcpy(dxh.data(), dx, dxh.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> dw_ref(O * I, 0.0), db_ref(O, 0.0), dx_ref(B * I, 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t o = 0; o < O; ++o) {
        const double g = static_cast<float>(ref[b * O + o]);  // the device's y, to float precision
        db_ref[o] += g;
        for (std::int64_t i = 0; i < I; ++i) {
          dw_ref[o * I + i] += g * xh[b * I + i];
          dx_ref[b * I + i] += g * wh[o * I + i];
        }
      }
    EXPECT_LT(rel_l2(std::vector<double>(dwh.begin(), dwh.end()), dw_ref), 1e-5) << "misaligned dw, out=" << O;
    EXPECT_LT(rel_l2(std::vector<double>(dbh.begin(), dbh.end()), db_ref), 1e-5) << "misaligned dbias, out=" << O;
    EXPECT_LT(rel_l2(std::vector<double>(dxh.begin(), dxh.end()), dx_ref), 1e-5) << "misaligned dx, out=" << O;
  }
}

TEST_F(CudaKernels, LinearSteadyStateDoesNotAllocate) {
  const LinearShape s{256, 784, 1024};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::size_t es = dtype == DType::kFloat32 ? 4 : 2;
    DeviceBuffer x(s.batch * s.in * es), w(s.out * s.in * es), b(s.out * es), y(s.batch * s.out * es);
    DeviceBuffer pre(s.batch * s.out * es), dy(s.batch * s.out * es), dz(s.batch * s.out * es);
    DeviceBuffer dx(s.batch * s.in * es), dw(s.out * s.in * es), db(s.out * es);
    for (DeviceBuffer* buf : {&x, &w, &b, &dy}) DDP_CUDA_CHECK(cudaMemset(buf->get(), 0, buf->bytes()));
    auto iteration = [&](int i) {
      for (Activation act : kActivations) {
        gpu::linear_forward(dtype, MathMode::kTF32, s, x.get(), w.get(), b.get(), act, y.get(),
                            act == Activation::kGelu ? pre.get() : nullptr, stream_);
        gpu::linear_backward(dtype, MathMode::kTF32, s, dy.get(), x.get(), w.get(), y.get(), pre.get(), act,
                             dx.get(), dw.get(), db.get(), i % 2 == 1, dz.get(), stream_);
      }
    };
    // Warm-up: the handle, the stream's workspace and every GEMM plan are created here.
    iteration(0);
    iteration(1);
    sync();
    std::size_t free_before = 0, total = 0, free_after = 0;
    DDP_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 100; ++i) iteration(i);
    sync();
    DDP_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    EXPECT_EQ(free_before, free_after) << "linear ops allocated device memory in steady state";
  }
}

// The whole forward/backward/update sequence can be captured into a CUDA graph and replayed, giving the same
// numbers as running it eagerly.
TEST_F(CudaKernels, LinearAndOptimizerAreGraphCapturable) {
  const LinearShape s{37, 129, 67};
  const std::int64_t B = s.batch, I = s.in, O = s.out;
  TypedBuffer x(DType::kFloat32, B * I), w(DType::kFloat32, O * I), b(DType::kFloat32, O);
  TypedBuffer y(DType::kFloat32, B * O), dx(DType::kFloat32, B * I), dw(DType::kFloat32, O * I);
  TypedBuffer db(DType::kFloat32, O), dz(DType::kFloat32, B * O);
  DeviceBuffer labels(B * 4), loss(4), dlogits(B * O * 4), norm(8);
  std::vector<std::int32_t> lh(B);
  for (std::int64_t i = 0; i < B; ++i) lh[i] = static_cast<std::int32_t>((i * 7) % O);
  upload(labels, lh);
  auto reset = [&] {
    x.set(random_nonzero(B * I, 1));
    w.set(random_nonzero(O * I, 2, 0.1f));
    b.set(random_nonzero(O, 3));
  };
  auto step = [&] {
    gpu::linear_forward(DType::kFloat32, MathMode::kFloat32, s, x.device.get(), w.device.get(),
                        b.device.get(), Activation::kRelu, y.device.get(), nullptr, stream_);
    gpu::softmax_cross_entropy(DType::kFloat32, y.device.get<float>(), labels.get<std::int32_t>(), B, O,
                               loss.get<float>(),
                               dlogits.get<float>(), stream_);
    gpu::linear_backward(DType::kFloat32, MathMode::kFloat32, s, dlogits.get(), x.device.get(),
                         w.device.get(), y.device.get(), nullptr, Activation::kRelu, dx.device.get(),
                         dw.device.get(), db.device.get(), false, dz.device.get(), stream_);
    gpu::sum_squares(dw.device.get<float>(), O * I, norm.get<double>(), stream_);
    SgdParams p{0.1f, 0.0f, 0.0f, 0.0f, false, false};
    gpu::sgd_step(w.device.get<float>(), dw.device.get<float>(), nullptr, O * I, p, nullptr, stream_);
  };
  reset();
  step();  // warm-up outside capture (lazy handle/workspace creation)
  sync();
  reset();
  step();
  sync();
  const auto w_eager = w.fetch();
  const auto loss_eager = download<float>(loss, 1);

  reset();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DDP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  step();
  DDP_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  DDP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  DDP_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  sync();
  const auto w_graph = w.fetch();
  const auto loss_graph = download<float>(loss, 1);
  DDP_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DDP_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_EQ(float_bits(loss_eager[0]), float_bits(loss_graph[0]));
  EXPECT_EQ(w_eager, w_graph);
}

// The one-launch reductions (the bias gradient's column sums over row chunks, cross-entropy's loss) share the
// stream's counters: each must leave them at zero, or the next launch's last block never sees itself last and
// its output stays poisoned (NaN), which the comparisons catch.
TEST_F(CudaKernels, OneLaunchReductionsFollowEachOther) {
  const LinearCase narrow{DType::kFloat32, MathMode::kFloat32, {4096, 64, 10}};  // 10 columns: the narrow kernel
  const LinearCase wide{DType::kFloat32, MathMode::kFloat32, {512, 64, 1024}};   // 32 column tiles, row chunks
  for (int round = 0; round < 3; ++round) {
    run_linear_backward_case(narrow, Activation::kNone, true, false, true, stream_);
    check_softmax_xent(256, 10, 0.0f, stream_);
    run_linear_backward_case(wide, Activation::kRelu, true, true, true, stream_);
    run_linear_backward_case(narrow, Activation::kRelu, true, true, true, stream_);
    check_softmax_xent(20000, 33, 0.0f, stream_);
  }
}

}  // namespace
}  // namespace ddp::kernels::testing
