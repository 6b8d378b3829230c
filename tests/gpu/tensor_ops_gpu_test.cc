// The GPU path against the CPU path: tensor copies and seeded initialisation (bitwise equal), the caching
// allocator's CUDA backend, every tensor-level op forward and backward, and a full MLP training step
// (forward, cross-entropy, backward, SGD) — skipped when no GPU is present.
//
// Error bounds, |gpu − cpu| <= atol + rtol·|cpu|, by dtype:
//   float32 (FP32 GEMMs): atol 1e-5, rtol 1e-4 — only summation order differs (K <= 64).
//   TF32: atol 1e-2, rtol 1e-2 — inputs rounded to a 10-bit mantissa (2^-11 relative), K <= 64 terms of size <= 1.
//   bfloat16: atol 3e-2, rtol 2e-2 — both sides see the same bf16 inputs and accumulate in FP32; outputs are
//     rounded to an 8-bit mantissa (2^-9 relative), so they may differ by about one bf16 ulp.
//   Elementwise ops and losses (float32): atol 1e-6, rtol 1e-5 (GELU's erf/exp differ in the last ulps).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/allocator.h"
#include "runtime/core/check.h"
#include "runtime/core/device.h"
#include "runtime/core/graph.h"
#include "runtime/data/finite_samples.h"
#include "runtime/data/replay_buffer.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/models/bf16_weights.h"
#include "runtime/models/fused_mlp_mse.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/optimizer.h"
#include "tests/models/residual_model.h"

namespace ddp {
namespace {

using ddp::Activation;
using ddp::MathMode;

struct Bound {
  double atol, rtol;
};
constexpr Bound kF32{1e-5, 1e-4};
constexpr Bound kTF32{1e-2, 1e-2};
constexpr Bound kBF16{3e-2, 2e-2};
constexpr Bound kElementwise{1e-6, 1e-5};

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, Bound b, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double tol = b.atol + b.rtol * std::abs(cpu[i]);
    if (std::abs(gpu[i] - cpu[i]) > tol && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i] << " (tolerance " << tol << ")";
    }
  }
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_availability().reason;
    stream_ = Stream::create(Device::cuda(0));
  }
  const Stream& s() const { return stream_; }
  std::vector<float> host(const Tensor& t) const {
    if (t.dtype() == DType::kBFloat16) return t.to_dtype(DType::kFloat32, t.device().is_cuda() ? s() : cpu_stream()).to_vector<float>(t.device().is_cuda() ? s() : cpu_stream());
    return t.to_vector<float>(t.device().is_cuda() ? s() : cpu_stream());
  }
  Tensor gpu(const Tensor& cpu_tensor) const {
    Tensor g = cpu_tensor.copy_to(Device::cuda(0), s());
    if (cpu_tensor.requires_grad()) g.set_requires_grad(true);
    return g;
  }
  Stream stream_;
};

Tensor cpu_leaf(const Shape& shape, std::uint64_t seed, DType dtype = DType::kFloat32) {
  Tensor t = Tensor::uniform(shape, -1.0f, 1.0f, seed, 0, Device::cpu(), cpu_stream(), dtype);
  t.set_requires_grad(true);
  return t;
}

TEST_F(Gpu, CopiesRoundTripAndViews) {
  std::vector<float> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  Tensor c = Tensor::from_vector(v, {100, 10}, Device::cpu(), cpu_stream());
  Tensor g = c.copy_to(Device::cuda(0), s());
  EXPECT_EQ(g.device(), Device::cuda(0));
  Tensor back = g.copy_to(Device::cpu(), s());
  EXPECT_TRUE(back.storage()->pinned());
  s().synchronize();
  EXPECT_EQ(back.to_vector<float>(cpu_stream()), v);
  // Row slices of device tensors, device-to-device copies, fills.
  Tensor rows = g.slice_rows(10, 20).clone(s());
  EXPECT_EQ(rows.to_vector<float>(s()), std::vector<float>(v.begin() + 100, v.begin() + 200));
  g.slice_rows(0, 1).fill_(-1.0, s());
  std::vector<float> after = g.to_vector<float>(s());
  EXPECT_EQ(after[9], -1.0f);
  EXPECT_EQ(after[10], 5.0f);
  // Into pageable host memory (synchronising path).
  Tensor pageable = Tensor::zeros({1000}, DType::kFloat32, Device::cpu(), cpu_stream());
  pageable.copy_from(g, s());
  EXPECT_EQ(pageable.to_vector<float>(cpu_stream()), after);
}

// A module written by a user, built from layers on the GPU, that never declares its own device: its flat store
// goes where its parameters are (it once went to the CPU and forward failed "x is on cuda:0 but weight is on cpu").
class UserModule : public Module {
 public:
  UserModule(const Device& a, const Device& b, const Stream& stream) {
    register_module("first", std::make_shared<Linear>(8, 4, true, 1, 0, a, stream));
    register_module("second", std::make_shared<Linear>(4, 2, true, 2, 0, b, stream));
  }
  Tensor forward(const Tensor& x, const Stream& stream) override {
    return children()[1].second->forward(children()[0].second->forward(x, stream), stream);
  }
  std::string type_name() const override { return "UserModule"; }
};

TEST_F(Gpu, AModuleFlattensOntoTheDeviceOfItsParameters) {
  UserModule on_gpu(Device::cuda(0), Device::cuda(0), s());
  ParameterStore& store = on_gpu.flatten_parameters(s());
  EXPECT_EQ(store.device(), Device::cuda(0));
  EXPECT_EQ(on_gpu.device(), Device::cuda(0));
  Tensor x = Tensor::uniform({3, 8}, -1.0f, 1.0f, 5, 0, Device::cuda(0), s());
  {
    // No graph left on the tape: its tensors would outlive this test's stream.
    autograd::NoGradGuard no_grad;
    EXPECT_EQ(on_gpu.forward(x, s()).device(), Device::cuda(0));
  }

  UserModule mixed(Device::cuda(0), Device::cpu(), s());
  try {
    mixed.flatten_parameters(s());
    FAIL() << "flattened parameters that live on two devices";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("first.weight is on cuda:0 but second.weight is on cpu"), std::string::npos)
        << e.what();
  }
}

// A data set held in the GPU's memory gives the batches the CPU copy gives, bit for bit, through each access width
// of the gather kernel: 16-byte pieces (rows of 8 floats), 4-byte pieces (rows of 3) and the int32 labels; at a
// given place and from the cursor the kernel itself moves on.
TEST_F(Gpu, ResidentBatchesMatchTheCpu) {
  for (std::int64_t features : {8, 3}) {
    data::Dataset d;
    d.size = 50;
    d.feature_count = features;
    for (std::int64_t i = 0; i < d.size * features; ++i) d.features.push_back(std::sin(0.1f * i));
    for (std::int64_t i = 0; i < d.size; ++i) d.labels.push_back(static_cast<std::int32_t>(i * 7 % 10));
    const std::vector<std::int64_t> order = {49, 0, 17, 17, 3, 28, 44, 1};
    data::ResidentDataset on_cpu(data::view(d), Device::cpu(), cpu_stream());
    data::ResidentDataset on_gpu(data::view(d), Device::cuda(0), s());
    on_cpu.set_order(order, cpu_stream());
    on_gpu.set_order(order, s());
    Tensor cx = Tensor::empty({5, features}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor cy = Tensor::empty({5}, DType::kInt32, Device::cpu(), cpu_stream());
    Tensor gx = Tensor::empty({5, features}, DType::kFloat32, Device::cuda(0), s());
    Tensor gy = Tensor::empty({5}, DType::kInt32, Device::cuda(0), s());
    on_cpu.gather(2, cx, cy, cpu_stream());
    on_gpu.gather(2, gx, gy, s());
    EXPECT_EQ(gx.to_vector<float>(s()), cx.to_vector<float>(cpu_stream())) << features << " features";
    EXPECT_EQ(gy.to_vector<std::int32_t>(s()), cy.to_vector<std::int32_t>(cpu_stream())) << features << " features";
    EXPECT_EQ(cy.to_vector<std::int32_t>(cpu_stream())[0], 17 * 7 % 10);
    // The batches that move the device-side cursor on, one launch each: the same rows as on the CPU.
    on_cpu.set_cursor(1, cpu_stream());
    on_gpu.set_cursor(1, s());
    for (int batch = 0; batch < 2; ++batch) {
      Tensor nx = Tensor::empty({3, features}, DType::kFloat32, Device::cuda(0), s());
      Tensor ny = Tensor::empty({3}, DType::kInt32, Device::cuda(0), s());
      Tensor mx = Tensor::empty({3, features}, DType::kFloat32, Device::cpu(), cpu_stream());
      Tensor my = Tensor::empty({3}, DType::kInt32, Device::cpu(), cpu_stream());
      on_cpu.gather_next(mx, my, cpu_stream());
      on_gpu.gather_next(nx, ny, s());
      EXPECT_EQ(nx.to_vector<float>(s()), mx.to_vector<float>(cpu_stream())) << "batch " << batch;
      EXPECT_EQ(ny.to_vector<std::int32_t>(s()), my.to_vector<std::int32_t>(cpu_stream())) << "batch " << batch;
    }
    EXPECT_EQ(on_gpu.cursor(), 7);
  }
}

// A replay buffer on the GPU fed from device arrays (the application's, through from_blob) and from host
// arrays, wrapping around its ring, draws the batches a CPU buffer fed the same samples draws, bit for bit.
TEST_F(Gpu, ReplayBufferOnTheGpuMatchesTheCpu) {
  data::ReplayBuffer on_cpu(7, 3, 2, Device::cpu(), cpu_stream());
  data::ReplayBuffer on_gpu(7, 3, 2, Device::cuda(0), s());
  for (int round = 0; round < 4; ++round) {
    std::vector<float> x, y;
    for (int i = 0; i < 5; ++i) {
      for (int k = 0; k < 3; ++k) x.push_back(std::sin(0.7f * (round * 15 + i * 3 + k)));
      for (int k = 0; k < 2; ++k) y.push_back(float(round * 10 + i) + 0.5f * k);
    }
    const Tensor hx = Tensor::from_blob(x.data(), {5, 3}, DType::kFloat32, Device::cpu());
    const Tensor hy = Tensor::from_blob(y.data(), {5, 2}, DType::kFloat32, Device::cpu());
    on_cpu.add(hx, hy, cpu_stream());
    if (round % 2 == 0) {
      on_gpu.add(hx.copy_to(Device::cuda(0), s()), hy.copy_to(Device::cuda(0), s()), s());
    } else {
      on_gpu.add(hx, hy, s());
    }
  }
  EXPECT_EQ(on_gpu.size(), 7);
  EXPECT_EQ(on_gpu.added(), 20);
  for (std::uint64_t draw = 0; draw < 3; ++draw) {
    Tensor cx = Tensor::empty({9, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor cy = Tensor::empty({9, 2}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor gx = Tensor::empty({9, 3}, DType::kFloat32, Device::cuda(0), s());
    Tensor gy = Tensor::empty({9, 2}, DType::kFloat32, Device::cuda(0), s());
    on_cpu.sample(5, draw, cx, cy, cpu_stream());
    on_gpu.sample(5, draw, gx, gy, s());
    EXPECT_EQ(gx.to_vector<float>(s()), cx.to_vector<float>(cpu_stream())) << "draw " << draw;
    const std::vector<float> ys = gy.to_vector<float>(s());
    EXPECT_EQ(ys, cy.to_vector<float>(cpu_stream())) << "draw " << draw;
    for (std::size_t i = 0; i < ys.size(); i += 2) EXPECT_GE(ys[i], 23.0f);  // the newest seven: 23, 24, 30..34
  }
  Tensor host_x = Tensor::empty({2, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
  Tensor host_y = Tensor::empty({2, 2}, DType::kFloat32, Device::cpu(), cpu_stream());
  EXPECT_THROW(on_gpu.sample(0, 0, host_x, host_y, s()), InvalidArgument);  // a batch goes to the buffer's device
}

// Samples that are not finite, in device arrays: the check runs on the GPU; refused naming the first as on the CPU,
// or skipped (the finite rows gathered on the device) and counted by the buffer.
TEST_F(Gpu, NonFiniteSamplesOnTheGpuAreRefusedOrSkipped) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0, 0, 1, 1, 2, nan, 3, 3}, y = {0, 10, 20, std::numeric_limits<float>::infinity()};
  const Tensor hx = Tensor::from_blob(x.data(), {4, 2}, DType::kFloat32, Device::cpu());
  const Tensor hy = Tensor::from_blob(y.data(), {4, 1}, DType::kFloat32, Device::cpu());
  const Tensor gx = hx.copy_to(Device::cuda(0), s()), gy = hy.copy_to(Device::cuda(0), s());
  std::string message;
  try {
    data::finite_samples(gx, gy, data::NonFinitePolicy::kRefuse, s());
  } catch (const InvalidArgument& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("x row 2, column 1"), std::string::npos) << message;
  const data::FiniteSamples kept = data::finite_samples(gx, gy, data::NonFinitePolicy::kSkip, s());
  EXPECT_EQ(kept.skipped, 2);
  EXPECT_EQ(kept.x.device(), Device::cuda(0));
  EXPECT_EQ(kept.x.to_vector<float>(s()), (std::vector<float>{0, 0, 1, 1}));
  EXPECT_EQ(kept.y.to_vector<float>(s()), (std::vector<float>{0, 10}));

  data::ReplayBuffer buffer(8, 2, 1, Device::cuda(0), s());
  EXPECT_THROW(buffer.add(gx, gy, s()), InvalidArgument);
  EXPECT_EQ(buffer.size(), 0);
  buffer.set_nonfinite(data::NonFinitePolicy::kSkip);
  buffer.add(gx, gy, s());
  buffer.add(hx, hy, s());  // host arrays into the GPU's buffer: checked on the host
  EXPECT_EQ(buffer.size(), 4);
  EXPECT_EQ(buffer.skipped(), 4);
}

// The next batch gathered on the prefetch's branch, from a captured graph replayed once per step and eagerly:
// the CPU's rows, and past the end of the order nothing gathered and the cursor where it was.
TEST_F(Gpu, PrefetchedBatchesMatchTheCpuAndStopAtTheEndOfTheOrder) {
  data::Dataset d;
  d.size = 30;
  d.feature_count = 5;
  for (std::int64_t i = 0; i < d.size * d.feature_count; ++i) d.features.push_back(std::cos(0.3f * i));
  for (std::int64_t i = 0; i < d.size; ++i) d.labels.push_back(static_cast<std::int32_t>(i));
  const std::vector<std::int64_t> order = {29, 3, 7, 7, 11, 0, 18, 2};  // batches of 3: [0, 3), [3, 6), [6, 8)
  data::ResidentDataset on_cpu(data::view(d), Device::cpu(), cpu_stream());
  data::ResidentDataset on_gpu(data::view(d), Device::cuda(0), s());
  on_cpu.set_order(order, cpu_stream());
  on_gpu.set_order(order, s());
  auto rows = [&](std::int64_t begin, std::int64_t n) {
    Tensor x = Tensor::empty({n, 5}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor y = Tensor::empty({n}, DType::kInt32, Device::cpu(), cpu_stream());
    on_cpu.gather(begin, x, y, cpu_stream());
    return std::make_pair(x.to_vector<float>(cpu_stream()), y.to_vector<std::int32_t>(cpu_stream()));
  };
  auto held = [&](const Tensor& x, const Tensor& y) {
    return std::make_pair(x.to_vector<float>(s()), y.to_vector<std::int32_t>(s()));
  };
  Tensor x = Tensor::empty({3, 5}, DType::kFloat32, Device::cuda(0), s());
  Tensor y = Tensor::empty({3}, DType::kInt32, Device::cuda(0), s());
  on_gpu.gather_next(x, y, s());
  CudaGraph graph = CudaGraph::capture(s(), [&] {
    on_gpu.prefetch_next(x, y, s());
    on_gpu.join_prefetch(s());
  });
  ASSERT_TRUE(graph.captured()) << graph.error();
  EXPECT_FALSE(on_gpu.take_prefetched(3));  // capturing ran nothing
  graph.replay(s());
  EXPECT_TRUE(on_gpu.take_prefetched(3));
  EXPECT_EQ(held(x, y), rows(3, 3));
  EXPECT_EQ(on_gpu.cursor(), 6);
  graph.replay(s());  // rows [6, 9) of 8: not gathered
  EXPECT_FALSE(on_gpu.take_prefetched(3));
  EXPECT_EQ(held(x, y), rows(3, 3));
  EXPECT_EQ(on_gpu.cursor(), 6);
  Tensor last_x = x.slice_rows(0, 2), last_y = y.slice_rows(0, 2);
  on_gpu.gather_next(last_x, last_y, s());  // the device's cursor stayed at 6 too
  EXPECT_EQ(held(last_x, last_y), rows(6, 2));
  on_gpu.set_order(order, s());  // the next epoch, prefetched eagerly
  on_gpu.prefetch_next(x, y, s());
  on_gpu.join_prefetch(s());
  EXPECT_TRUE(on_gpu.take_prefetched(3));
  EXPECT_EQ(held(x, y), rows(0, 3));
}

TEST_F(Gpu, SeededInitIsBitwiseIdentical) {
  for (std::uint64_t seed : {0ull, 7ull, 123456789ull}) {
    EXPECT_EQ(Tensor::uniform({4097}, -0.3f, 0.3f, seed, 5, Device::cuda(0), s()).to_vector<float>(s()),
              Tensor::uniform({4097}, -0.3f, 0.3f, seed, 5, Device::cpu(), cpu_stream()).to_vector<float>(cpu_stream()));
    EXPECT_EQ(Tensor::normal({4097}, 0.0f, 1.0f, seed, 5, Device::cuda(0), s()).to_vector<float>(s()),
              Tensor::normal({4097}, 0.0f, 1.0f, seed, 5, Device::cpu(), cpu_stream()).to_vector<float>(cpu_stream()));
  }
  MLP a({784, 128, 10}, Activation::kRelu, 3, Device::cpu(), cpu_stream());
  MLP b({784, 128, 10}, Activation::kRelu, 3, Device::cuda(0), s());
  for (std::size_t i = 0; i < a.state_dict().size(); ++i)
    EXPECT_EQ(a.state_dict()[i].second.to_vector<float>(cpu_stream()), b.state_dict()[i].second.to_vector<float>(s()));
}

TEST_F(Gpu, CachingAllocatorReusesWithoutCudaMalloc) {
  CachingAllocator& a = cuda_allocator(0);
  s().synchronize();
  for (int step = 0; step < 3; ++step) {  // warm up
    Tensor x = Tensor::empty({1 << 20}, DType::kFloat32, Device::cuda(0), s());
    Tensor y = Tensor::empty({1000}, DType::kFloat32, Device::cuda(0), s());
  }
  const MemoryStats before = a.stats();
  for (int step = 0; step < 100; ++step) {
    Tensor x = Tensor::empty({1 << 20}, DType::kFloat32, Device::cuda(0), s());
    Tensor y = Tensor::empty({1000}, DType::kFloat32, Device::cuda(0), s());
    x.fill_(1.0, s());
  }
  const MemoryStats after = a.stats();
  EXPECT_EQ(after.num_backend_allocs, before.num_backend_allocs) << "steady state must not call cudaMalloc";
  EXPECT_EQ(after.num_cache_hits - before.num_cache_hits, 200);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_GE(after.peak_bytes_in_use, before.bytes_in_use + (4 << 20));
  // Cross-stream: a block freed on s() with its work finished is reusable on another stream.
  Stream other = Stream::create(Device::cuda(0));
  void* p = a.allocate(3 << 20, s().handle());
  a.free(p);
  s().synchronize();
  void* q = a.allocate(3 << 20, other.handle());
  EXPECT_EQ(p, q);
  a.free(q);
  other.synchronize();
  a.empty_cache();
  EXPECT_LT(a.stats().bytes_reserved, after.bytes_reserved);
}

TEST_F(Gpu, PinnedAllocatorIsPageLocked) {
  EXPECT_TRUE(pinned_memory_available());
  const MemoryStats before = pinned_allocator().stats();
  Tensor c = Tensor::zeros({256}, DType::kFloat32, Device::cpu(), cpu_stream());
  for (int i = 0; i < 10; ++i) {
    Tensor g = c.copy_to(Device::cuda(0), s());  // staged through pinned memory
    s().synchronize();
  }
  EXPECT_LE(pinned_allocator().stats().num_backend_allocs - before.num_backend_allocs, 1);
}

// Forward and backward of linear on both devices; `math` and `dtype` pick the bound.
void linear_case(Gpu& t, const Stream& s, DType dtype, MathMode math, Activation act, Bound bound) {
  const std::int64_t B = 33, I = 64, O = 17;
  Tensor x = cpu_leaf({B, I}, 1, dtype), w = cpu_leaf({O, I}, 2, dtype), b = cpu_leaf({O}, 3, dtype);
  Tensor gx = x.copy_to(Device::cuda(0), s), gw = w.copy_to(Device::cuda(0), s), gb = b.copy_to(Device::cuda(0), s);
  for (Tensor* g : {&gx, &gw, &gb}) g->set_requires_grad(true);
  const std::string what = std::string(dtype_name(dtype)) + (math == MathMode::kTF32 ? "/tf32" : "") + " act " +
                           std::to_string(static_cast<int>(act));
  // Loss: mse against zeros on a float32 copy, so the upstream gradient is 2y/n on both sides.
  Tensor yc = ops::linear(x, w, b, act, cpu_stream(), math);
  Tensor yg = ops::linear(gx, gw, gb, act, s, math);
  std::vector<float> ycv, ygv;
  {
    autograd::NoGradGuard guard;
    ycv = yc.dtype() == DType::kFloat32 ? yc.to_vector<float>(cpu_stream())
                                        : yc.to_dtype(DType::kFloat32, cpu_stream()).to_vector<float>(cpu_stream());
    ygv = yg.dtype() == DType::kFloat32 ? yg.to_vector<float>(s) : yg.to_dtype(DType::kFloat32, s).to_vector<float>(s);
  }
  expect_close(ygv, ycv, bound, "linear forward " + what);
  if (dtype != DType::kFloat32) {
    autograd::clear_tape();  // the losses are float32-only; the bf16 backward is covered by cuda_kernels_test
    return;
  }
  autograd::backward(ops::mse_loss(yc, Tensor::zeros({B, O}, DType::kFloat32, Device::cpu(), cpu_stream()), cpu_stream()), cpu_stream());
  autograd::backward(ops::mse_loss(yg, Tensor::zeros({B, O}, DType::kFloat32, Device::cuda(0), s), s), s);
  expect_close(gx.grad().to_vector<float>(s), x.grad().to_vector<float>(cpu_stream()), bound, "dx " + what);
  expect_close(gw.grad().to_vector<float>(s), w.grad().to_vector<float>(cpu_stream()), bound, "dw " + what);
  expect_close(gb.grad().to_vector<float>(s), b.grad().to_vector<float>(cpu_stream()), bound, "db " + what);
}

TEST_F(Gpu, LinearFloat32) {
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu})
    linear_case(*this, s(), DType::kFloat32, MathMode::kFloat32, act, kF32);
}
TEST_F(Gpu, LinearTF32) {
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu})
    linear_case(*this, s(), DType::kFloat32, MathMode::kTF32, act, kTF32);
}
TEST_F(Gpu, LinearBfloat16Forward) {
  for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGelu})
    linear_case(*this, s(), DType::kBFloat16, MathMode::kFloat32, act, kBF16);
}

TEST_F(Gpu, ActivationsAndLosses) {
  for (Activation act : {Activation::kRelu, Activation::kGelu}) {
    Tensor x = cpu_leaf({7, 129}, 10);
    Tensor gx = gpu(x);
    Tensor t = Tensor::uniform({7, 129}, -1, 1, 11, 0, Device::cpu(), cpu_stream());
    Tensor yc = ops::activation(x, act, cpu_stream()), yg = ops::activation(gx, act, s());
    expect_close(host(yg), host(yc), kElementwise, "activation forward");
    autograd::backward(ops::mse_loss(yc, t, cpu_stream()), cpu_stream());
    autograd::backward(ops::mse_loss(yg, gpu(t), s()), s());
    expect_close(host(gx.grad()), host(x.grad()), kElementwise, "activation backward");
  }
  Tensor logits = cpu_leaf({65, 10}, 20);
  std::vector<std::int32_t> y(65);
  for (int i = 0; i < 65; ++i) y[i] = (i * 7) % 10;
  Tensor yc = Tensor::from_int32(y, {65}, Device::cpu(), cpu_stream());
  Tensor yg = yc.copy_to(Device::cuda(0), s());
  Tensor glogits = gpu(logits);
  Tensor lc = ops::cross_entropy(logits, yc, cpu_stream()), lg = ops::cross_entropy(glogits, yg, s());
  expect_close(host(lg), host(lc), kElementwise, "cross_entropy value");
  autograd::backward(lc, cpu_stream());
  autograd::backward(lg, s());
  expect_close(host(glogits.grad()), host(logits.grad()), kElementwise, "cross_entropy gradient");
  EXPECT_EQ(ops::argmax(glogits, s()).to_vector<std::int32_t>(s()), ops::argmax(logits, cpu_stream()).to_vector<std::int32_t>(cpu_stream()));
  EXPECT_EQ(ops::count_correct(glogits, yg, s()).to_vector<std::int64_t>(s()),
            ops::count_correct(logits, yc, cpu_stream()).to_vector<std::int64_t>(cpu_stream()));
  EXPECT_DOUBLE_EQ(ops::accuracy(glogits, yg, s()), ops::accuracy(logits, yc, cpu_stream()));
  Tensor p = cpu_leaf({300}, 30), t = Tensor::uniform({300}, -1, 1, 31, 0, Device::cpu(), cpu_stream());
  Tensor gp = gpu(p);
  Tensor mc = ops::mse_loss(p, t, cpu_stream()), mg = ops::mse_loss(gp, gpu(t), s());
  expect_close(host(mg), host(mc), kElementwise, "mse value");
  autograd::backward(mc, cpu_stream());
  autograd::backward(mg, s());
  expect_close(host(gp.grad()), host(p.grad()), kElementwise, "mse gradient");
}

// add, scale and mul on the GPU give the CPU's bits forward and backward; to_device's gradient crosses back in
// both directions.
TEST_F(Gpu, ElementwiseOpsAndDeviceCopies) {
  Tensor a = cpu_leaf({7, 129}, 40), b = cpu_leaf({7, 129}, 41);
  Tensor t = Tensor::uniform({7, 129}, -1, 1, 42, 0, Device::cpu(), cpu_stream());
  Tensor ga = gpu(a), gb = gpu(b);
  auto f = [](const Tensor& x, const Tensor& y, const Stream& st) {
    return ops::add(ops::mul(x, y, st), ops::scale(x, -0.75, st), st);
  };
  Tensor yc = f(a, b, cpu_stream()), yg = f(ga, gb, s());
  EXPECT_EQ(host(yg), host(yc));
  autograd::backward(ops::mse_loss(yc, t, cpu_stream()), cpu_stream());
  autograd::backward(ops::mse_loss(yg, gpu(t), s()), s());
  expect_close(host(ga.grad()), host(a.grad()), kElementwise, "elementwise gradient of a");
  expect_close(host(gb.grad()), host(b.grad()), kElementwise, "elementwise gradient of b");

  // CPU leaf -> GPU computation: the gradient comes back to the host.
  Tensor h = cpu_leaf({300}, 43);
  Tensor th = Tensor::uniform({300}, -1, 1, 44, 0, Device::cpu(), cpu_stream());
  autograd::backward(ops::mse_loss(ops::scale(ops::to_device(h, Device::cuda(0), s()), 2.0, s()), gpu(th), s()), s());
  Tensor h_ref = cpu_leaf({300}, 43);
  autograd::backward(ops::mse_loss(ops::scale(h_ref, 2.0, cpu_stream()), th, cpu_stream()), cpu_stream());
  expect_close(host(h.grad()), host(h_ref.grad()), kElementwise, "to_device(cuda) gradient");
  // GPU leaf -> CPU loss, backward on the GPU's stream.
  Tensor d = gpu(cpu_leaf({300}, 45));
  Tensor back = ops::to_device(d, Device::cpu(), s());
  s().synchronize();
  autograd::backward(ops::mse_loss(back, th, cpu_stream()), s());
  Tensor d_ref = cpu_leaf({300}, 45);
  autograd::backward(ops::mse_loss(d_ref, th, cpu_stream()), cpu_stream());
  expect_close(host(d.grad()), host(d_ref.grad()), kElementwise, "to_device(cpu) gradient");
}

// A full training step, three times: forward, cross-entropy, backward into the flat gradient buffer, SGD.
void mlp_steps(const Stream& s, MathMode math, Bound bound) {
  const std::vector<std::int64_t> sizes{64, 48, 32, 10};
  MLP cpu_model(sizes, Activation::kRelu, 9, Device::cpu(), cpu_stream());
  MLP gpu_model(sizes, Activation::kRelu, 9, Device::cuda(0), s);
  gpu_model.set_math_mode(math);
  ParameterStore& cs = cpu_model.flatten_parameters(cpu_stream(), {5, 4, 3, 2, 1, 0});
  ParameterStore& gs = gpu_model.flatten_parameters(s, {5, 4, 3, 2, 1, 0});
  SgdOptions o{0.05f, 0.9f, 0.0f, 1e-4f, true};
  Sgd copt(cs, o, cpu_stream()), gopt(gs, o, s);
  std::vector<std::size_t> hook_order;
  gs.add_grad_ready_hook([&](std::size_t i) { hook_order.push_back(i); });
  for (int step = 0; step < 3; ++step) {
    Tensor x = Tensor::uniform({32, 64}, -1, 1, 50 + step, 0, Device::cpu(), cpu_stream());
    std::vector<std::int32_t> y(32);
    for (int i = 0; i < 32; ++i) y[i] = (i * 3 + step) % 10;
    Tensor yc = Tensor::from_int32(y, {32}, Device::cpu(), cpu_stream());
    cpu_model.zero_grad(cpu_stream());
    gpu_model.zero_grad(s);
    Tensor lc = ops::cross_entropy(cpu_model.forward(x, cpu_stream()), yc, cpu_stream());
    Tensor lg = ops::cross_entropy(gpu_model.forward(x.copy_to(Device::cuda(0), s), s), yc.copy_to(Device::cuda(0), s), s);
    EXPECT_NEAR(lg.to_vector<float>(s)[0], lc.to_vector<float>(cpu_stream())[0], bound.atol + bound.rtol * 3);
    autograd::backward(lc, cpu_stream());
    autograd::backward(lg, s);
    expect_close(gs.flat_grads().to_vector<float>(s), cs.flat_grads().to_vector<float>(cpu_stream()), bound,
                 "flat gradients, step " + std::to_string(step));
    copt.step(cpu_stream());
    gopt.step(s);
  }
  expect_close(gs.flat_params().to_vector<float>(s), cs.flat_params().to_vector<float>(cpu_stream()), bound,
               "parameters after 3 steps");
  EXPECT_EQ(hook_order.size(), 18u);
}

TEST_F(Gpu, MlpTrainingStepFloat32) { mlp_steps(s(), MathMode::kFloat32, kF32); }
TEST_F(Gpu, MlpTrainingStepTF32) { mlp_steps(s(), MathMode::kTF32, kTF32); }

// clip_grad_norm on the GPU against the CPU after the same backward: the whole-buffer path, then the per-slot
// path (one gradient made stale by a lazy zero_grad, so it neither counts nor changes).
TEST_F(Gpu, ClipGradNormMatchesCpu) {
  const std::vector<std::int64_t> sizes{64, 48, 10};
  MLP cpu_model(sizes, Activation::kRelu, 4, Device::cpu(), cpu_stream());
  MLP gpu_model(sizes, Activation::kRelu, 4, Device::cuda(0), s());
  ParameterStore& cs = cpu_model.flatten_parameters(cpu_stream());
  ParameterStore& gs = gpu_model.flatten_parameters(s());
  Tensor x = Tensor::uniform({16, 64}, -1, 1, 77, 0, Device::cpu(), cpu_stream());
  std::vector<std::int32_t> y(16);
  for (int i = 0; i < 16; ++i) y[i] = i % 10;
  Tensor yc = Tensor::from_int32(y, {16}, Device::cpu(), cpu_stream());
  for (bool stale : {false, true}) {
    cpu_model.zero_grad(cpu_stream());
    gpu_model.zero_grad(s());
    autograd::backward(ops::cross_entropy(cpu_model.forward(x, cpu_stream()), yc, cpu_stream()), cpu_stream());
    autograd::backward(
        ops::cross_entropy(gpu_model.forward(x.copy_to(Device::cuda(0), s()), s()), yc.copy_to(Device::cuda(0), s()), s()),
        s());
    if (stale) {
      autograd::zero_grad({cs.slot(0).param});
      autograd::zero_grad({gs.slot(0).param});
    }
    const double norm = clip_grad_norm(cs, 1e9, cpu_stream());  // not reached: only measures
    ASSERT_GT(norm, 0.0);
    const double cpu_norm = clip_grad_norm(cs, 0.5 * norm, cpu_stream());
    const double gpu_norm = clip_grad_norm(gs, 0.5 * norm, s());
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-5 * cpu_norm) << (stale ? "per-slot path" : "whole-buffer path");
    expect_close(gs.flat_grads().to_vector<float>(s()), cs.flat_grads().to_vector<float>(cpu_stream()), kF32,
                 stale ? "clipped gradients, one stale" : "clipped gradients");
    EXPECT_NEAR(clip_grad_norm(gs, 1e9, s()), 0.5 * norm, 1e-5 * norm) << "norm after clipping";
  }
}

// Mixed precision on both devices: forward_bf16 (bf16 GEMMs, float32 logits and float32 gradients into the
// masters), SGD refreshing the bf16 copy in its own kernel. GPU and CPU see the same bf16 operands, so they
// agree to bf16 rounding; the GPU's copy is exactly the rounding of its masters.
TEST_F(Gpu, MlpBf16MixedPrecisionStepMatchesCpu) {
  const std::vector<std::int64_t> sizes{64, 48, 32, 10};
  MLP cpu_model(sizes, Activation::kRelu, 9, Device::cpu(), cpu_stream());
  MLP gpu_model(sizes, Activation::kRelu, 9, Device::cuda(0), s());
  ParameterStore& cs = cpu_model.flatten_parameters(cpu_stream(), {5, 4, 3, 2, 1, 0});
  ParameterStore& gs = gpu_model.flatten_parameters(s(), {5, 4, 3, 2, 1, 0});
  SgdOptions o{0.05, 0.9, 0.0, 1e-4, true};
  Sgd copt(cs, o, cpu_stream()), gopt(gs, o, s());
  Bf16Weights cw(cs, cpu_stream()), gw(gs, s());
  copt.set_bf16_copy(cw.flat());
  gopt.set_bf16_copy(gw.flat());
  int hooks = 0;
  gs.add_grad_ready_hook([&](std::size_t) { ++hooks; });
  for (int step = 0; step < 3; ++step) {
    Tensor x = Tensor::uniform({32, 64}, -1, 1, 70 + step, 0, Device::cpu(), cpu_stream());
    std::vector<std::int32_t> y(32);
    for (int i = 0; i < 32; ++i) y[i] = (i * 3 + step) % 10;
    Tensor yc = Tensor::from_int32(y, {32}, Device::cpu(), cpu_stream());
    cpu_model.zero_grad(cpu_stream());
    gpu_model.zero_grad(s());
    Tensor lc = ops::cross_entropy(forward_bf16(cpu_model, cw, x, cpu_stream()), yc, cpu_stream());
    Tensor lg = ops::cross_entropy(forward_bf16(gpu_model, gw, x.copy_to(Device::cuda(0), s()), s()),
                                   yc.copy_to(Device::cuda(0), s()), s());
    EXPECT_NEAR(lg.to_vector<float>(s())[0], lc.to_vector<float>(cpu_stream())[0], kBF16.atol + kBF16.rtol * 3);
    autograd::backward(lc, cpu_stream());
    autograd::backward(lg, s());
    expect_close(gs.flat_grads().to_vector<float>(s()), cs.flat_grads().to_vector<float>(cpu_stream()), kBF16,
                 "bf16 flat gradients, step " + std::to_string(step));
    copt.step(cpu_stream());
    gopt.step(s());
    const std::vector<float> rounded = host(gs.flat_params().to_dtype(DType::kBFloat16, s()));
    const std::vector<float> copy = host(gw.flat());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < copy.size(); ++i) differing += std::memcmp(&copy[i], &rounded[i], 4) != 0;
    EXPECT_EQ(differing, 0u) << "GPU bf16 copy vs its rounded masters, step " << step;
  }
  expect_close(gs.flat_params().to_vector<float>(s()), cs.flat_params().to_vector<float>(cpu_stream()), kBF16,
               "bf16 parameters after 3 steps");
  EXPECT_EQ(hooks, 18);
}

// ---- The MLP family's ops (runtime/ops/layers.h, SiLU) and modules: the GPU against the CPU, eagerly and from a
// CUDA graph, as a captured training step runs them. ----

// The stream every test below runs its CUDA graphs on, one for the whole process. Why not each test's own: the
// caching allocator (runtime/core/allocator.cc) records the event of a block freed during a capture into the
// graph, and cudaEventQuery of such an event fails (cudaErrorInvalidValue) when an allocation on another stream
// later considers the block; on the stream that captured, the allocator reuses the block without asking. Never
// destroyed: the CUDA runtime may be gone when static objects are.
const Stream& graph_stream() {
  static const Stream* stream = new Stream(Stream::create(Device::cuda(0)));
  return *stream;
}

// Host values of a tensor on the CPU or on graph_stream().
std::vector<float> on_host(const Tensor& t) {
  return t.to_vector<float>(t.device().is_cuda() ? graph_stream() : cpu_stream());
}

// One op's forward and the backward of an MSE loss over it: `inputs` makes the op's inputs on a device (the same
// values on each), `step` runs forward and backward on them and returns the output and the inputs' gradients.
struct LayerCase {
  std::string name;
  std::function<std::vector<Tensor>(const Device&, const Stream&)> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Stream&)> step;
  Bound bound;
};

// An MSE loss against a fixed target of y's shape, made on y's device, and its backward.
Tensor mse_backward(const Tensor& y, const Stream& s) {
  const Tensor target = Tensor::uniform(y.shape(), -1.0f, 1.0f, 4242, 0, y.device(), s);
  autograd::backward(ops::mse_loss(y, target, s), s);
  return y;
}

Tensor leaf_on(const Shape& shape, std::uint64_t seed, const Device& d, const Stream& s, float lo = -1, float hi = 1) {
  Tensor t = Tensor::uniform(shape, lo, hi, seed, 0, d, s);
  t.set_requires_grad(true);
  return t;
}

std::vector<Tensor> with_grads(const Tensor& y, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out{y};
  for (const Tensor& t : inputs)
    if (t.requires_grad()) out.push_back(t.grad());
  return out;
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  cases.push_back({"silu",
                   [](const Device& d, const Stream& s) {
                     return std::vector<Tensor>{leaf_on({7, 129}, 1, d, s, -5, 5)};
                   },
                   [](const std::vector<Tensor>& in, const Stream& s) {
                     return with_grads(mse_backward(ops::silu(in[0], s), s), in);
                   },
                   kElementwise});
  // Widths below, at and above one block of threads, rows of one element, and batches that the parameters'
  // gradient sums in several chunks of rows.
  for (const auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {33, 1}, {33, 37}, {33, 256}, {300, 1500}, {1000, 40}, {4097, 3}}) {
    cases.push_back({"layer_norm " + std::to_string(rows) + "x" + std::to_string(cols),
                     [rows, cols](const Device& d, const Stream& s) {
                       return std::vector<Tensor>{leaf_on({rows, cols}, 2, d, s, -2, 3), leaf_on({cols}, 3, d, s),
                                                  leaf_on({cols}, 4, d, s)};
                     },
                     [](const std::vector<Tensor>& in, const Stream& s) {
                       return with_grads(mse_backward(ops::layer_norm(in[0], in[1], in[2], 1e-5, s), s), in);
                     },
                     kF32});
  }
  for (bool include : {true, false}) {
    cases.push_back({include ? "frequency_encoding" : "frequency_encoding without the input",
                     [](const Device& d, const Stream& s) { return std::vector<Tensor>{leaf_on({65, 3}, 5, d, s)}; },
                     [include](const std::vector<Tensor>& in, const Stream& s) {
                       return with_grads(mse_backward(ops::frequency_encoding(in[0], 6, include, s), s), in);
                     },
                     Bound{1e-5, 1e-4}});
  }
  cases.push_back({"embedding",
                   [](const Device& d, const Stream& s) {
                     std::vector<std::int32_t> ids(200);
                     for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37) % 23);
                     return std::vector<Tensor>{leaf_on({23, 12}, 6, d, s), Tensor::from_int32(ids, {200}, d, s)};
                   },
                   [](const std::vector<Tensor>& in, const Stream& s) {
                     return with_grads(mse_backward(ops::embedding(in[0], in[1], s), s), in);
                   },
                   kElementwise});
  cases.push_back({"slice_columns and concat_columns",
                   [](const Device& d, const Stream& s) {
                     return std::vector<Tensor>{leaf_on({40, 9}, 7, d, s), leaf_on({40, 4}, 8, d, s)};
                   },
                   [](const std::vector<Tensor>& in, const Stream& s) {
                     const Tensor y = ops::concat_columns(
                         {ops::slice_columns(in[0], 2, 7, s), in[1], ops::slice_columns(in[0], 0, 1, s)}, s);
                     return with_grads(mse_backward(y, s), in);
                   },
                   kElementwise});
  cases.push_back({"dropout",
                   [](const Device& d, const Stream& s) {
                     return std::vector<Tensor>{leaf_on({31, 70}, 9, d, s),
                                                Tensor::full({1}, 5.0, DType::kInt64, d, s)};
                   },
                   [](const std::vector<Tensor>& in, const Stream& s) {
                     Tensor draw = in[1];
                     draw.fill_(5.0, s);  // the same mask each time: the draw is the case's input
                     return with_grads(mse_backward(ops::dropout(in[0], 0.25, 3, draw, s), s), in);
                   },
                   kElementwise});  // the same mask (DropoutDrawsANewMaskAtEachReplay checks its bits)
  return cases;
}

TEST_F(Gpu, LayerOpsMatchTheCpuEagerlyAndFromACudaGraph) {
  const Stream& gs = graph_stream();
  for (const LayerCase& c : layer_cases()) {
    const std::vector<Tensor> cpu_in = c.inputs(Device::cpu(), cpu_stream());
    std::vector<std::vector<float>> expected;
    for (const Tensor& t : c.step(cpu_in, cpu_stream())) expected.push_back(on_host(t));

    const std::vector<Tensor> in = c.inputs(Device::cuda(0), gs);
    std::vector<Tensor> eager = c.step(in, gs);
    ASSERT_EQ(eager.size(), expected.size()) << c.name;
    for (std::size_t k = 0; k < eager.size(); ++k)
      expect_close(on_host(eager[k]), expected[k], c.bound, c.name + (k == 0 ? " forward" : " gradient") + " eager");

    // The same step captured (after the eager one filled the allocator's cache, which it gives back here so that
    // the capture allocates nothing new), its results overwritten with NaN, then replayed: the graph alone must
    // write them again.
    eager.clear();
    for (const Tensor& t : in)
      if (t.requires_grad()) autograd::zero_grad({t});
    std::vector<Tensor> graphed;
    CudaGraph graph = CudaGraph::capture(gs, [&] { graphed = c.step(in, gs); });
    ASSERT_TRUE(graph.captured()) << c.name << ": " << graph.error();
    for (Tensor& t : graphed) t.fill_(NAN, gs);
    graph.replay(gs);
    for (std::size_t k = 0; k < graphed.size(); ++k)
      expect_close(on_host(graphed[k]), expected[k], c.bound, c.name + (k == 0 ? " forward" : " gradient") + " graph");
  }
}

// Dropout in a captured step: every replay draws the mask of the counter's next value (the CPU's mask for that
// draw, bit for bit), so no two replays share a mask, and the counter moves on with no host work.
TEST_F(Gpu, DropoutDrawsANewMaskAtEachReplay) {
  const Stream& gs = graph_stream();
  const Tensor x_cpu = Tensor::uniform({64, 40}, 0.5f, 1.5f, 10, 0, Device::cpu(), cpu_stream());
  const Tensor x = x_cpu.copy_to(Device::cuda(0), gs);
  Dropout on_gpu(0.5, 21, Device::cuda(0), gs);
  Dropout on_cpu(0.5, 21, Device::cpu(), cpu_stream());
  EXPECT_EQ(on_host(on_gpu.forward(x, gs)), on_host(on_cpu.forward(x_cpu, cpu_stream()))) << "eager draw 0";
  Tensor y;
  CudaGraph graph = CudaGraph::capture(gs, [&] { y = on_gpu.forward(x, gs); });
  ASSERT_TRUE(graph.captured()) << graph.error();
  EXPECT_EQ(on_gpu.draw().to_vector<std::int64_t>(gs)[0], 1) << "capturing ran nothing";
  std::vector<std::vector<float>> masks;
  for (int replay = 0; replay < 4; ++replay) {
    graph.replay(gs);
    masks.push_back(on_host(y));
    EXPECT_EQ(masks.back(), on_host(on_cpu.forward(x_cpu, cpu_stream()))) << "replay " << replay;
    for (int earlier = 0; earlier < replay; ++earlier) EXPECT_NE(masks[earlier], masks.back()) << replay;
  }
  EXPECT_EQ(on_gpu.draw().to_vector<std::int64_t>(gs)[0], 5);
  on_gpu.eval();
  EXPECT_TRUE(on_gpu.forward(x, gs).same(x));
  // to() moves the counter with the module, its value kept.
  on_cpu.to(Device::cuda(0), gs);
  EXPECT_EQ(on_cpu.draw().device(), Device::cuda(0));
  EXPECT_EQ(on_cpu.draw().to_vector<std::int64_t>(gs)[0], 5);
  const Tensor draw5 = Tensor::full({1}, 5.0, DType::kInt64, Device::cpu(), cpu_stream());
  EXPECT_EQ(on_host(on_cpu.forward(x, gs)), on_host(ops::dropout(x_cpu, 0.5, 21, draw5, cpu_stream())));
}

// The modules together on the GPU: the residual LayerNorm GELU model behind categorical features and a frequency
// encoding, a training step's forward and backward eagerly and from a graph against the CPU; and an id out of
// range on the GPU embeds as zeros instead of reading out of bounds.
TEST_F(Gpu, LayerModulesMatchTheCpuEagerlyAndFromACudaGraph) {
  const Stream& gs = graph_stream();
  struct Net {
    std::shared_ptr<CategoricalFeatures> categorical;
    std::shared_ptr<FrequencyEncoding> encoding;
    std::shared_ptr<Sequential> body;
    Tensor forward(const Tensor& x, const Stream& s) const {
      return body->forward(encoding->forward(categorical->forward(x, s), s), s);
    }
  };
  auto build = [](const Device& d, const Stream& s) {
    Net n;
    n.categorical = std::make_shared<CategoricalFeatures>(std::vector<std::int64_t>{5, 3}, 2, 1, d, s);
    n.encoding = std::make_shared<FrequencyEncoding>(6, 1);  // 2·2 + 2 features in, 18 out
    n.body = test::residual_layer_norm_gelu_model(2, d, s, 18, 32, 3);
    return n;
  };
  std::vector<float> rows;
  for (int r = 0; r < 48; ++r) {
    rows.insert(rows.end(), {static_cast<float>(r % 5), static_cast<float>((r * 7) % 3),
                             std::sin(0.3f * static_cast<float>(r)), std::cos(0.2f * static_cast<float>(r))});
  }
  const Tensor x_cpu = Tensor::from_vector(rows, {48, 4}, Device::cpu(), cpu_stream());
  const Tensor x = x_cpu.copy_to(Device::cuda(0), gs);
  const Net cpu_net = build(Device::cpu(), cpu_stream());
  const Net gpu_net = build(Device::cuda(0), gs);
  auto params = [](const Net& n) {
    std::vector<Tensor> out = n.categorical->parameters();
    for (const Tensor& p : n.body->parameters()) out.push_back(p);
    return out;
  };
  auto step = [&](const Net& n, const Tensor& input, const Stream& st) {
    for (const Tensor& p : params(n)) autograd::zero_grad({p});
    return with_grads(mse_backward(n.forward(input, st), st), params(n));
  };
  std::vector<std::vector<float>> expected;
  for (const Tensor& t : step(cpu_net, x_cpu, cpu_stream())) expected.push_back(on_host(t));
  const Bound bound{2e-5, 1e-4};
  std::vector<Tensor> eager = step(gpu_net, x, gs);
  for (std::size_t k = 0; k < eager.size(); ++k)
    expect_close(on_host(eager[k]), expected[k], bound, "modules eager " + std::to_string(k));
  eager.clear();  // its memory back to the allocator's cache, for the capture
  std::vector<Tensor> graphed;
  CudaGraph graph = CudaGraph::capture(gs, [&] { graphed = step(gpu_net, x, gs); });
  ASSERT_TRUE(graph.captured()) << graph.error();
  for (Tensor& t : graphed) t.fill_(NAN, gs);
  graph.replay(gs);
  for (std::size_t k = 0; k < graphed.size(); ++k)
    expect_close(on_host(graphed[k]), expected[k], bound, "modules graph " + std::to_string(k));

  autograd::NoGradGuard no_grad;
  const Tensor bad = Tensor::from_vector({7, 1, 0.5f, 0.25f, 2.5f, 0, 0, 0}, {2, 4}, Device::cpu(), cpu_stream());
  const std::vector<float> y = on_host(gpu_net.categorical->forward(bad.copy_to(Device::cuda(0), gs), gs));
  const std::vector<float> e1 = on_host(gpu_net.categorical->embeddings()[1].state_dict()[0].second);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 2), std::vector<float>(2, 0.0f)) << "id 7 of 5 categories";
  EXPECT_EQ(std::vector<float>(y.begin() + 2, y.begin() + 4), std::vector<float>(e1.begin() + 2, e1.begin() + 4));
  EXPECT_EQ(std::vector<float>(y.begin() + 6, y.begin() + 8), std::vector<float>(2, 0.0f)) << "id 2.5";
}

// The fused pass of a narrow MLP (the kernels' fused_mlp_mse) on the GPU against the CPU's autograd path: the
// loss and every gradient to float rounding, for batches of whole and partial blocks; then captured in a CUDA
// graph, its outputs overwritten with NaN and replayed: the same bits as the eager launch.
TEST_F(Gpu, FusedMlpPassMatchesTheCpuAutogradPathAndReplaysItsBits) {
  const Stream& gs = graph_stream();
  for (Activation act : {Activation::kTanh, Activation::kRelu}) {
    for (std::int64_t rows : {256, 1000}) {
      const std::string what = std::string(activation_name(act)) + ", " + std::to_string(rows) + " rows";
      MLP reference({5, 64, 64, 1}, act, 3), on_gpu({5, 64, 64, 1}, act, 3, Device::cuda(0), gs);
      AdamW reference_opt(reference, {}), gpu_opt(on_gpu, {}, gs);
      const Tensor x = Tensor::uniform({rows, 5}, -1.0f, 1.0f, 21, 0, Device::cpu(), cpu_stream());
      const Tensor y = Tensor::uniform({rows, 1}, -1.0f, 1.0f, 22, 0, Device::cpu(), cpu_stream());
      reference_opt.zero_grad(cpu_stream());
      const Tensor want = ops::mse_loss(reference.forward(x, cpu_stream()), y, cpu_stream());
      autograd::backward(want, cpu_stream());
      std::vector<float> want_grads;
      for (const auto& [name, t] : reference.state_dict()) {
        const std::vector<float> g = on_host(t.grad());
        want_grads.insert(want_grads.end(), g.begin(), g.end());
      }

      FusedMlpMse fused(on_gpu);
      const Tensor gx = x.copy_to(Device::cuda(0), gs), gy = y.copy_to(Device::cuda(0), gs);
      const auto pass = [&] {
        gpu_opt.zero_grad(gs);
        return fused(gx, gy, gs);
      };
      const auto grads = [&] {
        std::vector<float> all;
        for (const auto& [name, t] : on_gpu.state_dict()) {
          const std::vector<float> g = on_host(t.grad());
          all.insert(all.end(), g.begin(), g.end());
        }
        return all;
      };
      const std::vector<float> eager_loss = on_host(pass());
      const std::vector<float> eager_grads = grads();
      expect_close(eager_loss, on_host(want), kF32, what + " loss");
      expect_close(eager_grads, want_grads, kF32, what + " gradients");

      Tensor graphed;
      CudaGraph graph = CudaGraph::capture(gs, [&] { graphed = pass(); });
      ASSERT_TRUE(graph.captured()) << what << ": " << graph.error();
      graphed.fill_(NAN, gs);
      for (const auto& [name, t] : on_gpu.state_dict()) t.grad().fill_(NAN, gs);
      graph.replay(gs);
      EXPECT_EQ(on_host(graphed), eager_loss) << what;
      EXPECT_EQ(grads(), eager_grads) << what;
    }
  }
}

}  // namespace
}  // namespace ddp
