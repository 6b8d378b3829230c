// The rank wrapper: the process mpirun starts for every rank, which runs the program and reports how it ended.
// mpirun says only that "a process" failed, and its teardown makes every rank fail; the wrapper's exit marker
// (failure_tracker.h), time-stamped, lets ddprun name the rank that failed first and whether it was a stop.
#pragma once

#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// Where the rank wrappers of this node also leave their exit markers (a file per rank), named to them by this
// variable in mpirun's environment, which its local ranks inherit: mpirun stops relaying the ranks' output
// once it is signalled itself (Slurm signals every process of a job at once), and the markers of ranks that
// then stop as asked would be lost with it.
constexpr const char* kExitDirVariable = "DDPRUN_EXIT_DIR";

// ddprun --ddprun-rank-wrapper -- PROGRAM ARGS: runs the program as its child (which dies with the wrapper:
// PR_SET_PDEATHSIG), passes SIGINT/SIGTERM (and SIGUSR2) on, and when the program ends with a non-zero status
// or a signal prints exit_marker(...) to stderr with the rank (OMPI_COMM_WORLD_RANK), the time and whether it
// had been told to stop, then exits with the same status. The wrapper itself dies (SIGKILL, PR_SET_PDEATHSIG)
// when mpirun dies without ending it.
int run_rank_wrapper(const std::vector<std::string>& program);

}  // namespace launcher
}  // namespace ddp
