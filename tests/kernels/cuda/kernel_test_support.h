// What the CUDA kernels' tests share: bfloat16 and float bits on the host, the relative L2 error, random non-zero
// inputs, device buffers (plain, and float matrices held as float32 or bfloat16 with the exact host values), the
// activations' double-precision references, and the fixture that skips without a GPU and owns the stream.
//
// Each test compares a kernel against a double-precision reference computed on the host with naive loops, on
// random non-zero inputs of awkward sizes; outputs are poisoned with NaN before each call, so an element a kernel
// forgets to write fails the comparison. Tolerances (relative L2 error ‖got − ref‖ / ‖ref‖): float32 1e-5,
// float32 with TF32 tensor cores 5e-3, bfloat16 2e-2, elementwise float32 kernels and optimizers 1e-6, losses
// 1e-5, sum_squares 1e-12; casts, fills and random numbers exact.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::testing {

namespace gpu = ::ddp::kernels::cuda;

inline std::uint16_t bf16_bits(float f) {  // round to nearest even, NaN stays NaN
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
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
inline std::vector<float> random_nonzero(std::size_t n, std::uint32_t seed, float magnitude = 1.0f) {
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

// The activations a Linear fuses.
inline constexpr Activation kActivations[] = {Activation::kNone, Activation::kRelu, Activation::kGelu};

inline double gelu_ref(double z) { return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0))); }
inline double gelu_grad_ref(double z) {
  return 0.5 * (1.0 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
}
inline double act_ref(Activation a, double z) {
  return a == Activation::kRelu ? (z > 0 ? z : 0.0) : a == Activation::kGelu ? gelu_ref(z) : z;
}
inline double act_grad_ref(Activation a, double saved) {
  return a == Activation::kRelu ? (saved > 0 ? 1.0 : 0.0) : a == Activation::kGelu ? gelu_grad_ref(saved) : 1.0;
}
inline const char* act_name(Activation a) {
  return a == Activation::kRelu ? "relu" : a == Activation::kGelu ? "gelu" : "none";
}


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

// softmax_cross_entropy on `batch` rows of `classes` logits (shifted by `offset`) against the reference: the loss
// in float32, the gradient in the logits' type (losses_test.cc).
void check_softmax_xent(std::int64_t batch, std::int64_t classes, float offset, cudaStream_t stream,
                        DType dtype = DType::kFloat32);

}  // namespace ddp::kernels::testing
