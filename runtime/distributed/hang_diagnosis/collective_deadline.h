// Every collective has a deadline, DDP_COLLECTIVE_TIMEOUT_S. The process groups' collectives are followed by
// their watchdog (watchdog.h); the collectives the runtime makes on the calling thread over MPI (the World's
// sums and agreements, the DDP_DEBUG=collectives check) wait here, polling a nonblocking request, so that a rank
// that never joins them ends the job with a report of where every rank is instead of a hang.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

namespace ddp {

// "5 s", "0.5 s", "1e+06 s": a timeout as messages print it.
std::string timeout_text(double seconds);

// DDP_COLLECTIVE_TIMEOUT_S (runtime/core/settings.h): a number of seconds in (0, 1e6], 300 when unset. Throws
// InvalidArgument naming the variable, the value and the bounds for anything else ("inf", "1e10", "-1", "5s");
// longer timeouts would overflow the clocks' arithmetic, and a collective that may take longer is a hang.
double default_collective_timeout_s();

// How this process's messages name it: "rank 1", or "session rank 1 (world rank 3)" when its rank in the session's
// communicator is not its rank in MPI_COMM_WORLD (a session on a split communicator), since ddprun's and mpirun's
// prefixes are world ranks.
std::string rank_name(int session_rank);

// Waits for `request` to complete. Past the deadline it ends the job (end_job_after_timeout, side_channel.h),
// naming the collective with `describe()`: "rank 1's World::sum #815 of 3 float64 (host)".
void wait_within_deadline(MPI_Request* request, const std::function<std::string()>& describe);

}  // namespace ddp
