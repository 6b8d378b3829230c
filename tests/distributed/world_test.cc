// Bootstrap: ranks and node-local ranks are consistent across the world, the GPU binding follows
// local_rank % gpus, and a failure on some ranks ends every rank with one message naming them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stop_request.h"
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

// An application's communicator: a World on the odd and even halves of the world has the half's ranks, talks
// over a duplicate (a receive the application posted on the half, matching anything, sees none of its
// traffic), and leaves MPI running (the application owns it).
TEST(World, JoinsASplitOfTheApplicationsCommunicator) {
  World& world = test_world();
  MPI_Comm half = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(mpi_comm(world), world.rank() % 2, world.rank(), &half), MPI_SUCCESS);
  int half_rank = -1;
  int half_size = 0;
  MPI_Comm_rank(half, &half_rank);
  MPI_Comm_size(half, &half_size);
  int incoming = -1;
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Irecv(&incoming, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, half, &request);
  {
    World sub(ApplicationCommunicator{MPI_Comm_c2f(half)}, WorldOptions{.device = DeviceRequest::kCpu});
    EXPECT_EQ(sub.rank(), half_rank);
    EXPECT_EQ(sub.size(), half_size);
    EXPECT_EQ(sub.sum(1.0), half_size);
    int same = MPI_UNEQUAL;
    MPI_Comm_compare(mpi_comm(sub), half, &same);
    EXPECT_EQ(same, MPI_CONGRUENT);  // the same ranks, another context: its messages never match ours
    int arrived = 1;
    MPI_Test(&request, &arrived, MPI_STATUS_IGNORE);
    EXPECT_FALSE(arrived) << "the runtime's traffic matched the application's receive";
  }
  MPI_Barrier(half);  // every rank has looked before any sends the message it waits for
  const int mine = 100 + half_rank;
  MPI_Send(&mine, 1, MPI_INT, (half_rank + 1) % half_size, 3, half);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  EXPECT_EQ(incoming, 100 + (half_rank + half_size - 1) % half_size);
  MPI_Comm_free(&half);
}

TEST(World, RefusesANullCommunicatorOnTheCallingRankAlone) {
  try {
    World sub(ApplicationCommunicator{-1}, WorldOptions{.device = DeviceRequest::kCpu});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_COMM_NULL"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mpi_thread_level_problem(), "");
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

// An error in the job's input is agreed as such, and rank 0 exits with the status ddprun does not restart.
TEST(World, AnAgreedInputErrorEndsWithTheStatusThatIsNotRestarted) {
  World& world = test_world();
  try {
    world.agree("a flag is wrong", "bad command line", AgreedError::kInput);
    FAIL();
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.kind(), AgreedError::kInput);
    EXPECT_EQ(agreed_error_exit_status(e), kInputErrorExitStatus);
  }
  try {
    world.agree("the disk is full", "checkpoint write failed");
    FAIL();
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.kind(), AgreedError::kMayPassOnRetry);
    EXPECT_EQ(agreed_error_exit_status(e), 1);
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
    EXPECT_NE(what.find("Ask for the CPU (DeviceRequest::kCpu"), std::string::npos) << what;
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
