#include "runtime/core/start_marker.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ddp {

std::string start_marker_line(const StartMarker& marker) {
  return "ddprun-start: rank=" + std::to_string(marker.rank) + (marker.mpi_ready ? " mpi_ready" : " mpi_init");
}

std::optional<StartMarker> parse_start_marker(const std::string& text) {
  int rank = -1;
  char event[16] = {0};
  char tail = 0;
  if (std::sscanf(text.c_str(), "ddprun-start: rank=%d %15s%c", &rank, event, &tail) != 2 || rank < 0) {
    return std::nullopt;
  }
  const std::string what = event;
  if (what != "mpi_init" && what != "mpi_ready") return std::nullopt;
  return StartMarker{rank, what == "mpi_ready"};
}

void tell_launcher_start(bool mpi_ready) {
  if (std::getenv(kStartMarkersVariable) == nullptr) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr) rank = std::getenv("PMIX_RANK");
  if (rank == nullptr) return;
  const std::string line = start_marker_line(StartMarker{std::atoi(rank), mpi_ready}) + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace ddp
