// GoogleTest main for tests that run as several MPI ranks (see bazel/mpi_test.bzl). The World is created
// before any test and finalised after all of them; the exit code is the worst over all ranks, so a failure on
// rank 3 fails the test even though rank 0 passed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "runtime/core/settings.h"
#include "runtime/distributed/world_mpi.h"
#include "tests/distributed/test_world.h"

namespace ddp::testing {
namespace {
World* g_world = nullptr;
}  // namespace

World& test_world() { return *g_world; }

}  // namespace ddp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ddp::WorldOptions options;
  options.device = ddp::parse_device_request(ddp::settings::text(ddp::settings::setting("DDP_TEST_DEVICE")));
  options.nccl = ddp::settings::text(ddp::settings::setting("DDP_BACKEND")) != "mpi";
  ddp::World world(&argc, &argv, options);
  ddp::testing::g_world = &world;
  int local = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&local, &worst, 1, MPI_INT, MPI_MAX, mpi_comm(world));
  return worst;
}
