#include "runtime/distributed/collective_deadline.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/distributed/comm_check.h"
#include "runtime/distributed/side_channel.h"

namespace ddp {

double default_collective_timeout_s() {
  if (const char* env = std::getenv("DDP_COLLECTIVE_TIMEOUT_S")) {
    char* end = nullptr;
    const double value = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(value > 0)) {
      throw InvalidArgument(std::string("DDP_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '") +
                            env + "'");
    }
    return value;
  }
  return 300.0;
}

void wait_within_deadline(MPI_Request* request, const std::function<std::string()>& describe) {
  using Clock = std::chrono::steady_clock;
  static const double timeout_s = default_collective_timeout_s();
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    int done = 0;
    DDP_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const Clock::time_point now = Clock::now();
    if (now > deadline) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      end_job_after_timeout(rank,
                            describe() + " did not complete within " + std::to_string(static_cast<int>(timeout_s)) +
                                " s (DDP_COLLECTIVE_TIMEOUT_S)",
                            nullptr);
    }
    // Spin while the others are about to arrive (the usual case); once a wait is long, poll gently, so that a
    // rank waiting for a late one leaves its core to the ranks still working.
    if (now - start > std::chrono::milliseconds(2)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace ddp
