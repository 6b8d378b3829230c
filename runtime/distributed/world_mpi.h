// The MPI side of a World, for the runtime's own MPI calls (the process groups, the parameter check, tests).
// Kept out of world.h so that the public header, which includes world.h, pulls in no <mpi.h>: user code reaches
// the other ranks through the World's host collectives and the process group, never through MPI itself.
#pragma once

#include <mpi.h>

#include "runtime/distributed/world.h"

namespace ddp {

struct WorldMpi {
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD whose errors return as status codes
};

// The world's communicator.
inline MPI_Comm mpi_comm(const World& world) { return world.mpi().comm; }

}  // namespace ddp
