#include "runtime/distributed/hang_diagnosis/collective_deadline.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/core/deadline.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/hang_diagnosis/side_channel.h"
#include "runtime/distributed/mpi_nccl_errors.h"

namespace ddp {

std::string timeout_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

double default_collective_timeout_s() {
  return settings::seconds(settings::setting("DDP_COLLECTIVE_TIMEOUT_S"));
}

std::string rank_name(int session_rank) {
  int running = 0, finalized = 0, world_rank = -1;
  MPI_Initialized(&running);
  MPI_Finalized(&finalized);
  if (running && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (world_rank < 0 || world_rank == session_rank) return "rank " + std::to_string(session_rank);
  return "session rank " + std::to_string(session_rank) + " (world rank " + std::to_string(world_rank) + ")";
}

void wait_within_deadline(MPI_Request* request, const std::function<std::string()>& describe) {
  static const double timeout_s = default_collective_timeout_s();
  const auto start = std::chrono::steady_clock::now();
  const Deadline deadline(timeout_s);
  for (;;) {
    int done = 0;
    DDP_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (deadline.passed()) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      end_job_after_timeout(rank,
                            describe() + " did not complete within " + timeout_text(timeout_s) +
                                " (DDP_COLLECTIVE_TIMEOUT_S)",
                            nullptr);
    }
    // Spin while the others are about to arrive (the usual case); once a wait is long, poll gently, so that a
    // rank waiting for a late one leaves its core to the ranks still working.
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(2)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace ddp
