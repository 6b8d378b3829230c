// A session on a split communicator in which one rank never joins a collective: the hang report must name each
// rank by its session rank and by its world rank, the number ddprun's and mpirun's prefixes show
// (split_stall_test.sh). 4 ranks: world ranks 1 and 3 make one session (session ranks 0 and 1), world ranks 0
// and 2 another; world rank 3 sleeps instead of joining World::sum.
#include <mpi.h>

#include <chrono>
#include <thread>

#include "runtime/distributed/world.h"

int main(int argc, char** argv) {
  int provided = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  return ddp::run_main([&] {
    ddp::World world(ddp::ApplicationCommunicator{MPI_Comm_c2f(half)});
    if (rank == 3) std::this_thread::sleep_for(std::chrono::seconds(120));
    if (rank % 2 == 1) world.sum(1.0);
    std::this_thread::sleep_for(std::chrono::seconds(120));  // the other session waits for the job's end
    return 0;
  });
}
