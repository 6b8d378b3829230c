// The MPI side of a World, for the runtime's own MPI calls (the process groups, the model agreement check, tests).
// Kept out of world.h so that the public header, which includes world.h, pulls in no <mpi.h>: user code reaches
// the other ranks through the World's host collectives and the process group, never through MPI itself.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>

#include "runtime/distributed/world.h"

namespace ddp {

struct WorldMpi {
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD whose errors return as status codes
};

// The world's communicator.
inline MPI_Comm mpi_comm(const World& world) { return world.mpi().comm; }

// Runs the host collective that `start` issues (a nonblocking MPI call on the calling thread) as flight-recorder
// collective `operation` (a string literal) of `count` elements of `dtype`, under the collective deadline and
// DDP_DEBUG=collectives' comparison (a difference throws CollectiveError). `count` must be the same on every
// rank (for a gather, the whole count). Every MPI collective the runtime makes outside a process group goes
// through here (the World's, the model agreement check's, a sharded checkpoint's gathers), so that none can hang
// without a report or be missing from the flight recorder.
void run_host_collective(const char* operation, std::int64_t count, DType dtype,
                         const std::function<int(MPI_Request*)>& start);

}  // namespace ddp
