// Every collective has a deadline, DDP_COLLECTIVE_TIMEOUT_S. The process groups' collectives are followed by
// their watchdog (watchdog.h); the collectives the runtime makes on the calling thread over MPI (the World's
// sums and agreements, the DDP_DEBUG=collectives check) wait here, polling a nonblocking request, so that a rank
// that never joins them ends the job with a report of where every rank is instead of a hang.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace ddp {

// DDP_COLLECTIVE_TIMEOUT_S when set (seconds, > 0), else 300. Throws InvalidArgument for anything else.
double default_collective_timeout_s();

// Waits for `request` to complete. Past the deadline it ends the job (end_job_after_timeout, side_channel.h),
// naming the collective with `describe()`: "rank 1's World::sum #815 of 3 float64 (host)".
void wait_within_deadline(MPI_Request* request, const std::function<std::string()>& describe);

}  // namespace ddp
