// Every function of ddp::kernels::cuda against a double-precision reference computed here on the host with naive
// loops, on random non-zero inputs of awkward sizes. Outputs are poisoned with NaN before each call, so an element
// a kernel forgets to write fails the comparison. Random fills must equal runtime/kernels/counter_rng.h evaluated on the host
// bit for bit, and steady-state calls must not allocate device memory or break CUDA-graph capture.
//
// Tolerances (relative L2 error ‖got − ref‖ / ‖ref‖):
//   float32 (MathMode::kFloat32) 1e-5, float32 with TF32 tensor cores 5e-3, bfloat16 2e-2,
//   elementwise float32 kernels and optimizers 1e-6, losses 1e-5, sum_squares 1e-12; casts, fills and random
//   numbers exact.
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

namespace ddp::kernels {
namespace {

namespace gpu = ::ddp::kernels::cuda;

// ---------------------------------------------------------------------------------------------------------------
// Host helpers
// ---------------------------------------------------------------------------------------------------------------

std::uint16_t bf16_bits(float f) {  // round to nearest even, NaN stays NaN
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (std::isnan(num)) return std::numeric_limits<double>::infinity();
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Random values in ±[0.05, 1): never zero, so a kernel that skips an element cannot pass by luck.
std::vector<float> random_nonzero(std::size_t n, std::uint32_t seed, float magnitude = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(0.05f, 1.0f);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = (sign(rng) ? 1.0f : -1.0f) * mag(rng) * magnitude;
  return v;
}

// A device allocation owned by the test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    DDP_CUDA_CHECK(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  ~DeviceBuffer() { DDP_CUDA_WARN(cudaFree(ptr_)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  // All-ones bytes: NaN for float32 and bfloat16, -1 for integers.
  void poison() const { DDP_CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_)); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

template <typename T>
void upload(const DeviceBuffer& d, const std::vector<T>& h) {
  ASSERT_LE(h.size() * sizeof(T), d.bytes());
  DDP_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> download(const DeviceBuffer& d, std::size_t n) {
  std::vector<T> h(n);
  DDP_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// A float matrix stored on the device as float32 or bfloat16; `host` holds the exact values the device holds.
struct TypedBuffer {
  DType dtype;
  std::vector<double> host;
  DeviceBuffer device;
  TypedBuffer(DType t, std::size_t n) : dtype(t), host(n, 0.0), device(n * (t == DType::kFloat32 ? 4 : 2)) {}
  std::size_t size() const { return host.size(); }
  void set(const std::vector<float>& values) {
    host.resize(values.size());
    if (dtype == DType::kFloat32) {
      for (std::size_t i = 0; i < values.size(); ++i) host[i] = values[i];
      upload(device, values);
    } else {
      std::vector<std::uint16_t> bits(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        bits[i] = bf16_bits(values[i]);
        host[i] = bf16_to_float(bits[i]);
      }
      upload(device, bits);
    }
  }
  std::vector<double> fetch() const {
    std::vector<double> out(size());
    if (dtype == DType::kFloat32) {
      const auto f = download<float>(device, size());
      for (std::size_t i = 0; i < f.size(); ++i) out[i] = f[i];
    } else {
      const auto b = download<std::uint16_t>(device, size());
      for (std::size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_float(b[i]);
    }
    return out;
  }
};

double gelu_ref(double z) { return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0))); }
double gelu_grad_ref(double z) {
  return 0.5 * (1.0 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
}
double act_ref(Activation a, double z) {
  return a == Activation::kRelu ? (z > 0 ? z : 0.0) : a == Activation::kGelu ? gelu_ref(z) : z;
}
double act_grad_ref(Activation a, double saved) {
  return a == Activation::kRelu ? (saved > 0 ? 1.0 : 0.0) : a == Activation::kGelu ? gelu_grad_ref(saved) : 1.0;
}
const char* act_name(Activation a) {
  return a == Activation::kRelu ? "relu" : a == Activation::kGelu ? "gelu" : "none";
}

// ---------------------------------------------------------------------------------------------------------------
// Fixture: skips without a GPU, owns one non-blocking stream
// ---------------------------------------------------------------------------------------------------------------

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no usable CUDA device: "
                   << (status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount returned 0");
    }
    DDP_CUDA_CHECK(cudaSetDevice(0));
    // A blocking stream: the test's plain cudaMemcpy/cudaMemset calls (legacy default stream) are then ordered
    // with the kernels on it. With a non-blocking stream a pageable upload may still be in flight when the
    // kernel reads its destination.
    DDP_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) DDP_CUDA_WARN(cudaStreamDestroy(stream_));
  }
  void sync() { DDP_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  cudaStream_t stream_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------------------------------------

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

const Activation kActivations[] = {Activation::kNone, Activation::kRelu, Activation::kGelu};

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

// ---------------------------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------------------------

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
          gpu::activation_backward(act, x, dy, dx, n, accumulate, stream_);
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

// ---------------------------------------------------------------------------------------------------------------
// Losses
// ---------------------------------------------------------------------------------------------------------------

// float32 or bfloat16 logits (mixed precision): the loss is computed in float32 from the logits as stored, the
// gradient is stored in the logits' type (bf16: within its rounding, 2^-9 relative).
void check_softmax_xent(std::int64_t batch, std::int64_t classes, float offset, cudaStream_t stream,
                        DType dtype = DType::kFloat32) {
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

// The one-launch reductions (the bias gradient's column sums over row chunks, cross-entropy's loss) share the
// stream's counters: each must leave them at zero, or the next launch's last block never sees itself last and
// its output stays poisoned (NaN), which the comparisons catch.
TEST_F(CudaKernels, OneLaunchReductionsFollowEachOther) {
  const LinearCase narrow{DType::kFloat32, MathMode::kFloat32, {4096, 64, 10}};  // 10 columns, many row chunks
  const LinearCase wide{DType::kFloat32, MathMode::kFloat32, {512, 64, 1024}};   // the 16-byte path, 4 tiles
  for (int round = 0; round < 3; ++round) {
    run_linear_backward_case(narrow, Activation::kNone, true, false, true, stream_);
    check_softmax_xent(256, 10, 0.0f, stream_);
    run_linear_backward_case(wide, Activation::kRelu, true, true, true, stream_);
    run_linear_backward_case(narrow, Activation::kRelu, true, true, true, stream_);
    check_softmax_xent(20000, 33, 0.0f, stream_);
  }
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

// ---------------------------------------------------------------------------------------------------------------
// Elementwise utilities
// ---------------------------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------------------------
// Random numbers: the device evaluates runtime/kernels/counter_rng.h exactly as the host does
// ---------------------------------------------------------------------------------------------------------------

TEST_F(CudaKernels, RandomMatchesHostCounterRngBitForBit) {
  const std::int64_t n = 300007;
  const std::uint64_t seed = 0x0123456789abcdefULL, offset = 123456789ULL;
  DeviceBuffer u(n * 4), g(n * 4), part(10 * 4);
  u.poison();
  g.poison();
  gpu::uniform(u.get<float>(), n, -0.25f, 0.75f, seed, offset, stream_);
  gpu::normal(g.get<float>(), n, 0.5f, 2.0f, seed, offset, stream_);
  sync();
  const auto uh = download<float>(u, n);
  const auto gh = download<float>(g, n);
  std::int64_t normal_mismatches = 0;
  double normal_max_diff = 0.0;
  double sum = 0.0, sum2 = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float want_u = counter_rng::uniform_at(seed, offset + i, -0.25f, 0.75f);
    ASSERT_EQ(float_bits(uh[i]), float_bits(want_u)) << "uniform element " << i;
    ASSERT_GE(uh[i], -0.25f);
    ASSERT_LE(uh[i], 0.75f);
    const float want_g = counter_rng::normal_at(seed, offset + i, 0.5f, 2.0f);
    if (float_bits(gh[i]) != float_bits(want_g)) {
      ++normal_mismatches;
      normal_max_diff = std::max(normal_max_diff, std::abs(static_cast<double>(gh[i]) - want_g));
    }
    sum += gh[i];
    sum2 += static_cast<double>(gh[i]) * gh[i];
  }
  EXPECT_EQ(normal_mismatches, 0) << "normal differs from the host in " << normal_mismatches
                                  << " elements, max |diff| " << normal_max_diff;
  const double mean = sum / n, var = sum2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(var, 4.0, 0.05);
  // Independent of the launch: a sub-range at a later offset gives the same values.
  gpu::uniform(part.get<float>(), 10, -0.25f, 0.75f, seed, offset + 1000, stream_);
  sync();
  const auto ph = download<float>(part, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(float_bits(ph[i]), float_bits(uh[1000 + i]));
}

// ---------------------------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------------------------

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
}  // namespace ddp::kernels
