// Bootstrap: ranks and node-local ranks are consistent across the world, the GPU binding follows
// local_rank % gpus, and a failure on some ranks ends every rank with one message naming them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/distributed/world_mpi.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;

TEST(World, RanksCoverZeroToSizeOnce) {
  World& world = test_world();
  ASSERT_GE(world.size(), 1);
  ASSERT_GE(world.rank(), 0);
  ASSERT_LT(world.rank(), world.size());
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(world.size(), std::atoi(size));
  }
  std::vector<int> ranks(world.size());
  int mine = world.rank();
  ASSERT_EQ(MPI_Allgather(&mine, 1, MPI_INT, ranks.data(), 1, MPI_INT, mpi_comm(world)), MPI_SUCCESS);
  std::vector<int> expected(world.size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(ranks, expected);
}

TEST(World, LocalRanksDescribeThisNode) {
  World& world = test_world();
  EXPECT_GE(world.local_rank(), 0);
  EXPECT_LT(world.local_rank(), world.local_size());
  // All ranks of these tests run on one machine.
  EXPECT_EQ(world.local_size(), world.size());
  EXPECT_EQ(world.local_rank(), world.rank());
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    EXPECT_EQ(world.local_rank(), std::atoi(local));
  }
  EXPECT_FALSE(world.node_name().empty());
}

TEST(World, DeviceFollowsLocalRankModuloGpus) {
  World& world = test_world();
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    EXPECT_TRUE(world.device().is_cpu());
    EXPECT_EQ(world.nccl(), nullptr);
  } else if (world.device().is_cuda()) {
    EXPECT_EQ(world.device().index, world.local_rank() % gpus);
  }
}

TEST(World, HostCollectivesSumAndMaxOverRanks) {
  World& w = test_world();
  const int n = w.size(), r = w.rank();
  EXPECT_EQ(w.sum(r + 1.0), n * (n + 1) / 2.0);
  EXPECT_EQ(w.max(static_cast<double>(r)), n - 1.0);
  double pair[2] = {1.0, static_cast<double>(r)};
  w.sum_in_place(pair, 2);
  EXPECT_EQ(pair[0], n);
  EXPECT_EQ(pair[1], n * (n - 1) / 2.0);
  EXPECT_TRUE(w.any(r == n - 1));
  EXPECT_FALSE(w.any(false));
}

TEST(World, AgreePassesWhenNoRankFails) { EXPECT_NO_THROW(test_world().agree("", "nothing")); }

TEST(World, AgreeThrowsOnEveryRankNamingTheFailingRank) {
  World& world = test_world();
  const int last = world.size() - 1;
  const std::string mine = world.rank() == last ? "boom on the last rank" : "";
  try {
    world.agree(mine, "setup failed");
    FAIL() << "agree returned although rank " << last << " failed";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("setup failed"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(last) + ": boom on the last rank"), std::string::npos) << what;
    EXPECT_EQ(e.rank(), world.rank());
  }
}

TEST(World, AgreeGroupsRanksThatFailedAlike) {
  World& world = test_world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  try {
    world.agree("same failure", "setup failed");
    FAIL();
  } catch (const CollectiveError& e) {
    std::string ranks = "ranks 0";
    for (int r = 1; r < world.size(); ++r) ranks += "," + std::to_string(r);
    EXPECT_NE(std::string(e.what()).find(ranks + ": same failure"), std::string::npos) << e.what();
  }
}

TEST(World, CudaWithoutGpuEndsEveryRankWithAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  WorldOptions options;
  options.device = DeviceRequest::kCuda;
  try {
    World second(nullptr, nullptr, options);  // joins the MPI that test_world set up
    FAIL() << "a CUDA world was created without a GPU";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA was asked for"), std::string::npos) << what;
    EXPECT_NE(what.find("--device cpu"), std::string::npos) << what;
  }
}

TEST(World, ParsesDeviceRequests) {
  EXPECT_EQ(parse_device_request("auto"), DeviceRequest::kAuto);
  EXPECT_EQ(parse_device_request("cpu"), DeviceRequest::kCpu);
  EXPECT_EQ(parse_device_request("cuda"), DeviceRequest::kCuda);
  EXPECT_THROW(parse_device_request("gpu"), InvalidArgument);
}

}  // namespace
}  // namespace ddp
