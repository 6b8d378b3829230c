// On a GPU machine: the world creates its NCCL communicator from rank 0's unique ID, and an all-reduce through
// it sums every rank's contribution. More NCCL ranks on a node than GPUs is refused on every rank.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/nccl_communicator.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;

TEST(NcclWorld, AllReduceSumsAcrossRanks) {
  World& world = test_world();
  if (!world.device().is_cuda()) GTEST_SKIP() << "no GPU: " << cuda_availability().reason;
  if (world.nccl() == nullptr) GTEST_SKIP() << "world started with the MPI backend (DDP_BACKEND=mpi)";
  EXPECT_EQ(world.nccl()->size(), world.size());
  EXPECT_EQ(world.nccl()->rank(), world.rank());
  Stream stream = Stream::create(world.device());
  const int n = 1 << 20;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) + world.rank();
  float* data = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&data, n * sizeof(float)));
  DDP_CUDA_CHECK(cudaMemcpyAsync(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream.handle()));
  DDP_NCCL_CALL(world.nccl(), ncclAllReduce(data, data, n, ncclFloat, ncclSum, world.nccl()->handle(),
                                            stream.handle()));
  DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, stream.handle()));
  stream.synchronize();
  DDP_CUDA_CHECK(cudaFree(data));
  const int p = world.size();
  const float rank_sum = static_cast<float>(p * (p - 1) / 2);
  for (int i = 0; i < n; i += 4097) ASSERT_EQ(host[i], p * static_cast<float>(i % 1000) + rank_sum) << i;
}

TEST(NcclWorld, MoreNcclRanksThanGpusIsRefusedOnEveryRank) {
  World& world = test_world();
  const int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU";
  if (world.local_size() <= gpus) GTEST_SKIP() << "needs more ranks on this node than its " << gpus << " GPU(s)";
  WorldOptions options;
  options.device = DeviceRequest::kCuda;
  try {
    World second(nullptr, nullptr, options);
    FAIL() << "NCCL world created with " << world.local_size() << " ranks on " << gpus << " GPUs";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL needs one GPU per rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp
