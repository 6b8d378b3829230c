// The runtime inside an MPI application: include "ddp_mpi.h" (it includes <mpi.h> and "ddp.h") and make the
// session on the application's communicator. ddp.h itself never includes <mpi.h>; this header is the one
// place a C++ program hands an MPI_Comm over (Bazel: //:ddp_mpi; installed beside ddp.h).
//
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);   // the application owns MPI
//   MPI_Comm train;
//   MPI_Comm_split(MPI_COMM_WORLD, is_trainer ? 0 : MPI_UNDEFINED, rank, &train);
//   if (is_trainer) {
//     ddp::Session session(ddp::communicator(train));   // duplicates `train`: its traffic never meets yours
//     ...                                                // your own MPI calls on any communicator meanwhile
//   }                                                    // the session is gone before MPI_Finalize
//   MPI_Finalize();
//
// docs/embedding.md has the rules: the thread level, what the application may do on its communicators while
// the runtime's communication thread runs, and who owns which memory.
#pragma once

#include <mpi.h>

#include "ddp.h"

namespace ddp {

// The application's communicator as the runtime takes it (its Fortran handle, which the runtime converts back).
inline ApplicationCommunicator communicator(MPI_Comm comm) {
  return ApplicationCommunicator{comm == MPI_COMM_NULL ? -1 : static_cast<std::int64_t>(MPI_Comm_c2f(comm))};
}

}  // namespace ddp
