// On a GPU: streams and events own their handles, events order work between streams without a host wait,
// and timing events measure it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace ddp {
namespace {

TEST(StreamGpu, EventOrdersWorkAcrossStreams) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_availability().reason;
  const Device gpu = Device::cuda(0);
  CudaDeviceGuard guard(gpu);
  Stream producer = Stream::create(gpu);
  Stream consumer = Stream::create(gpu);
  ASSERT_NE(producer.handle(), nullptr);
  const size_t n = 64 << 20;  // large enough that the copy is still running when the consumer is queued
  char* a = nullptr;
  char* b = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&a, n));
  DDP_CUDA_CHECK(cudaMalloc(&b, n));
  DDP_CUDA_CHECK(cudaMemsetAsync(a, 0, n, producer.handle()));
  for (int i = 0; i < 20; ++i) DDP_CUDA_CHECK(cudaMemsetAsync(a, 7, n, producer.handle()));
  Event ready = Event::create(gpu);
  ready.record(producer);
  ready.wait(consumer);
  DDP_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, consumer.handle()));
  std::vector<char> host(16);
  DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), b + n - 16, 16, cudaMemcpyDeviceToHost, consumer.handle()));
  consumer.synchronize();
  for (char c : host) EXPECT_EQ(c, 7);
  DDP_CUDA_CHECK(cudaFree(a));
  DDP_CUDA_CHECK(cudaFree(b));
}

TEST(StreamGpu, TimingEventsMeasureElapsedTime) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_availability().reason;
  const Device gpu = Device::cuda(0);
  Stream s = Stream::create(gpu);
  Event start = Event::create(gpu, /*timing=*/true);
  Event stop = Event::create(gpu, /*timing=*/true);
  char* a = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&a, 1 << 26));
  start.record(s);
  for (int i = 0; i < 10; ++i) DDP_CUDA_CHECK(cudaMemsetAsync(a, i, 1 << 26, s.handle()));
  stop.record(s);
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  EXPECT_GT(stop.elapsed_ms_since(start), 0.0f);
  DDP_CUDA_CHECK(cudaFree(a));
}

TEST(StreamGpu, MovedFromOwnersReleaseNothing) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_availability().reason;
  Stream a = Stream::create(Device::cuda(0));
  CUstream_st* handle = a.handle();
  Stream b = std::move(a);
  EXPECT_EQ(a.handle(), nullptr);
  EXPECT_EQ(b.handle(), handle);
  Event e = Event::create(Device::cuda(0));
  Event f = std::move(e);
  EXPECT_EQ(e.handle(), nullptr);
  EXPECT_NE(f.handle(), nullptr);
  b.synchronize();
}

}  // namespace
}  // namespace ddp
