// Under ddprun, each rank's runtime says when it begins starting MPI and when MPI has started, in lines of their
// own that ddprun takes out of the output. A rank that never gets through MPI_Init (stopped, or stuck before it)
// leaves the others inside MPI_Init, where no collective of ours exists to time out: only the launcher, which
// hears from every rank, can notice and name it (launcher/start_watch.h).
#pragma once

#include <optional>
#include <string>

namespace ddp {

// Set by ddprun's rank wrapper in its program's environment: the markers are wanted.
inline constexpr const char* kStartMarkersVariable = "DDPRUN_START_MARKERS";

// "ddprun-start: rank=R mpi_init" (about to call MPI_Init) or "ddprun-start: rank=R mpi_ready" (it returned).
struct StartMarker {
  int rank = -1;
  bool mpi_ready = false;
};
std::string start_marker_line(const StartMarker& marker);
// The marker in `text` (a line without mpirun's tag), or nothing.
std::optional<StartMarker> parse_start_marker(const std::string& text);

// Prints the marker for this process (its rank as the launcher gave it, OMPI_COMM_WORLD_RANK or PMIX_RANK) to
// stderr in one write, when kStartMarkersVariable is set; nothing otherwise.
void tell_launcher_start(bool mpi_ready);

}  // namespace ddp
