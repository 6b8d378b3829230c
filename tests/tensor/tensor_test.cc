// Tensor on the CPU: creation, views and row slices sharing storage, copies, fills, dtype checks, bf16 casts,
// and seeded random initialisation matching runtime/kernels/counter_rng.h element by element.
#include "runtime/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/kernels/counter_rng.h"
#include "runtime/core/check.h"

namespace ddp {
namespace {

const Device kCpu = Device::cpu();

std::vector<float> iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

TEST(Tensor, CreationAndProperties) {
  Tensor t = Tensor::zeros({3, 4}, DType::kFloat32, kCpu, cpu_stream());
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(0), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.describe(), "float32 [3, 4] on cpu");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 64, 0u);
  for (float v : t.to_vector<float>(cpu_stream())) EXPECT_EQ(v, 0.0f);
  Tensor s = Tensor::full({}, 2.5, DType::kFloat32, kCpu, cpu_stream());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.to_vector<float>(cpu_stream())[0], 2.5f);
  Tensor i64 = Tensor::full({2}, 7, DType::kInt64, kCpu, cpu_stream());
  EXPECT_EQ(i64.to_vector<std::int64_t>(cpu_stream()), (std::vector<std::int64_t>{7, 7}));
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_THROW(undefined.shape(), Error);
}

// A tensor over the caller's memory reads and writes it in place, and leaves it to the caller when it goes.
TEST(Tensor, FromBlobIsTheCallersMemoryWithoutACopy) {
  const ddp::Stream& stream = ddp::cpu_stream();
  std::vector<float> mine = {1, 2, 3, 4, 5, 6};
  {
    Tensor t = Tensor::from_blob(mine.data(), {2, 3}, DType::kFloat32, Device::cpu());
    EXPECT_EQ(t.data_ptr(), mine.data());
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
    EXPECT_EQ(t.slice_rows(1, 2).to_vector<float>(stream), (std::vector<float>{4, 5, 6}));
    t.scale_(2.0, stream);
  }
  EXPECT_EQ(mine, (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_THROW(Tensor::from_blob(nullptr, {2, 3}, DType::kFloat32, Device::cpu()), ddp::InvalidArgument);
  EXPECT_NO_THROW(Tensor::from_blob(nullptr, {0, 3}, DType::kFloat32, Device::cpu()));
}

TEST(Tensor, ItemAndFromHost) {
  const std::int64_t counts[3] = {7, -2, 1LL << 40};
  Tensor t = Tensor::from_host(counts, {3}, DType::kInt64, Device::cpu(), cpu_stream());
  EXPECT_EQ(t.to_vector<std::int64_t>(cpu_stream()), (std::vector<std::int64_t>{7, -2, 1LL << 40}));
  EXPECT_EQ(t.flat_slice(2, {1}).item(cpu_stream()), static_cast<double>(1LL << 40));
  EXPECT_EQ(Tensor::full({1, 1}, 0.375, DType::kFloat32, Device::cpu(), cpu_stream()).item(cpu_stream()), 0.375);
  EXPECT_EQ(Tensor::full({1}, -3, DType::kInt32, Device::cpu(), cpu_stream()).item(cpu_stream()), -3.0);
  EXPECT_THROW(t.item(cpu_stream()), InvalidArgument);  // three elements
}

TEST(Tensor, DtypeIsChecked) {
  Tensor t = Tensor::zeros({2}, DType::kInt32, kCpu, cpu_stream());
  EXPECT_NO_THROW(t.data<std::int32_t>());
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(t.to_vector<float>(cpu_stream()), Error);
  EXPECT_THROW(t.set_requires_grad(true), Error);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector(iota(12), {3, 4}, kCpu, cpu_stream());
  Tensor v = t.view({4, -1});
  EXPECT_EQ(v.shape(), (Shape{4, 3}));
  EXPECT_TRUE(v.shares_storage_with(t));
  v.data<float>()[5] = 100.0f;
  EXPECT_EQ(t.data<float>()[5], 100.0f);
  EXPECT_THROW(t.view({5, 3}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_EQ(t.flatten().shape(), (Shape{12}));
}

TEST(Tensor, RowSlices) {
  Tensor t = Tensor::from_vector(iota(12), {4, 3}, kCpu, cpu_stream());
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.storage_offset(), 3);
  EXPECT_EQ(rows.to_vector<float>(cpu_stream()), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  Tensor inner = rows.slice_rows(1, 2);  // a slice of a slice
  EXPECT_EQ(inner.to_vector<float>(cpu_stream()), (std::vector<float>{6, 7, 8}));
  inner.fill_(-1.0, cpu_stream());
  EXPECT_EQ(t.to_vector<float>(cpu_stream())[6], -1.0f);
  EXPECT_EQ(t.to_vector<float>(cpu_stream())[9], 9.0f);
  EXPECT_EQ(t.slice_rows(4, 4).numel(), 0);
  EXPECT_THROW(t.slice_rows(2, 5), Error);
  Tensor flat = t.flat_slice(2, {2, 2});
  EXPECT_EQ(flat.to_vector<float>(cpu_stream()), (std::vector<float>{2, 3, 4, 5}));
  EXPECT_THROW(t.flat_slice(10, {3}), Error);
}

TEST(Tensor, CopiesAreDeep) {
  Tensor t = Tensor::from_vector(iota(6), {2, 3}, kCpu, cpu_stream());
  Tensor c = t.clone(cpu_stream());
  EXPECT_FALSE(c.shares_storage_with(t));
  c.fill_(0.0, cpu_stream());
  EXPECT_EQ(t.to_vector<float>(cpu_stream())[1], 1.0f);
  Tensor dst = Tensor::zeros({6}, DType::kFloat32, kCpu, cpu_stream());
  dst.copy_from(t, cpu_stream());  // different shape, same numel
  EXPECT_EQ(dst.to_vector<float>(cpu_stream()), iota(6));
  Tensor wrong = Tensor::zeros({5}, DType::kFloat32, kCpu, cpu_stream());
  EXPECT_THROW(wrong.copy_from(t, cpu_stream()), Error);
  // A copy into a row slice touches only those rows.
  Tensor big = Tensor::zeros({3, 3}, DType::kFloat32, kCpu, cpu_stream());
  big.slice_rows(1, 2).copy_from(Tensor::full({3}, 5.0, DType::kFloat32, kCpu, cpu_stream()), cpu_stream());
  EXPECT_EQ(big.to_vector<float>(cpu_stream()), (std::vector<float>{0, 0, 0, 5, 5, 5, 0, 0, 0}));
}

TEST(Tensor, SetDataRepointsEveryHandle) {
  Tensor a = Tensor::from_vector({1, 2}, {2}, kCpu, cpu_stream());
  Tensor alias = a;  // another handle of the same tensor
  Tensor buffer = Tensor::from_vector({9, 8, 7, 6}, {4}, kCpu, cpu_stream());
  a.set_data(buffer.flat_slice(2, {2}));
  EXPECT_EQ(alias.to_vector<float>(cpu_stream()), (std::vector<float>{7, 6}));
  EXPECT_TRUE(alias.shares_storage_with(buffer));
  EXPECT_THROW(a.set_data(buffer), Error);  // shape mismatch
}

TEST(Tensor, Bfloat16RoundTrip) {
  Tensor f = Tensor::from_vector({1.0f, 1.00390625f, 3.14159f, -2.5f}, {4}, kCpu, cpu_stream());
  Tensor h = f.to_dtype(DType::kBFloat16, cpu_stream());
  EXPECT_EQ(h.dtype(), DType::kBFloat16);
  EXPECT_EQ(h.nbytes(), 8u);
  std::vector<float> back = h.to_dtype(DType::kFloat32, cpu_stream()).to_vector<float>(cpu_stream());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f);  // halfway: ties to even
  EXPECT_NEAR(back[2], 3.14159f, 3.14159f / 128);
  EXPECT_EQ(back[3], -2.5f);
}

TEST(Tensor, SeededUniformMatchesCounterRng) {
  const std::uint64_t seed = 1234, offset = 77;
  Tensor t = Tensor::uniform({5, 7}, -0.5f, 0.5f, seed, offset, kCpu, cpu_stream());
  std::vector<float> v = t.to_vector<float>(cpu_stream());
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], counter_rng::uniform_at(seed, offset + i, -0.5f, 0.5f));
    EXPECT_GE(v[i], -0.5f);
    EXPECT_LE(v[i], 0.5f);
  }
  // Same seed, same values; an offset shifts the sequence; another seed differs.
  EXPECT_EQ(Tensor::uniform({35}, -0.5f, 0.5f, seed, offset, kCpu, cpu_stream()).to_vector<float>(cpu_stream()), v);
  std::vector<float> shifted =
      Tensor::uniform({34}, -0.5f, 0.5f, seed, offset + 1, kCpu, cpu_stream()).to_vector<float>(cpu_stream());
  EXPECT_EQ(shifted[0], v[1]);
  EXPECT_NE(Tensor::uniform({35}, -0.5f, 0.5f, seed + 1, offset, kCpu, cpu_stream()).to_vector<float>(cpu_stream()), v);
  Tensor n = Tensor::normal({1000}, 1.0f, 2.0f, seed, 0, kCpu, cpu_stream());
  std::vector<float> nv = n.to_vector<float>(cpu_stream());
  double mean = 0;
  for (float x : nv) mean += x;
  mean /= nv.size();
  EXPECT_NEAR(mean, 1.0, 0.2);
  EXPECT_EQ(nv[3], counter_rng::normal_at(seed, 3, 1.0f, 2.0f));
}

TEST(Tensor, CopyToCudaWithoutGpuFailsClearly) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present; tests/gpu covers device copies";
  Tensor t = Tensor::zeros({2}, DType::kFloat32, kCpu, cpu_stream());
  EXPECT_THROW(t.copy_to(Device::cuda(0), cpu_stream()), Error);
}

}  // namespace
}  // namespace ddp
