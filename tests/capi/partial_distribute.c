/* A C program that calls ddp_model_distribute on rank 0 only, the others going on to a barrier of the
 * application's: the ranks that distribute must not wait for ever in the making of the process group, but end the
 * job after DDP_COLLECTIVE_TIMEOUT_S with a report naming the rank that never came (partial_distribute_test.sh). */
#include <stdio.h>

#include <mpi.h>

#include "capi/ddp_c.h"

int main(int argc, char** argv) {
  int provided = 0, rank = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ddp_session* session = NULL;
  ddp_model* model = NULL;
  const int64_t sizes[] = {3, 8, 2};
  if (ddp_session_create(MPI_COMM_WORLD, "cpu", &session) != DDP_OK ||
      ddp_mlp_create(session, 3, sizes, "relu", 0, &model) != DDP_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0 && ddp_model_distribute(model) != DDP_OK) fprintf(stderr, "rank 0: %s\n", ddp_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  printf("rank %d: past the barrier\n", rank);
  ddp_model_destroy(model);
  ddp_session_destroy(session);
  MPI_Finalize();
  return 0;
}
