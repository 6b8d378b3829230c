// Running the mpirun command as a child: its output relayed line by line with "[rank R] " prefixes, the first
// failing rank noted, signals passed on, and its exit status returned.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

struct JobResult {
  int exit_status = 0;  // the child's exit code, or 128 + signal number
  std::optional<int> first_failed_rank;
  std::string first_failure_how;  // "exit status 3", "signal 9", or empty when unknown
  bool interrupted = false;  // ddprun itself received SIGINT/SIGTERM (no restart then)
};

// Runs `argv` (argv[0] is looked up in PATH) with stdout and stderr through pipes, relaying each line to this
// process's stdout or stderr (the stream the rank wrote to) after rewrite_tagged_line. Throws ddp::Error when
// the process cannot be started.
// Exit markers of the rank wrappers are consumed here, not relayed.
JobResult run_job(const std::vector<std::string>& argv);

// The rank wrapper (ddprun --ddprun-rank-wrapper -- PROGRAM ARGS, started by mpirun on every rank): runs the
// program as its child (which dies with the wrapper: PR_SET_PDEATHSIG), passes SIGINT/SIGTERM on, and when the
// program ends with a non-zero status or a signal prints exit_marker(...) to stderr with the rank
// (OMPI_COMM_WORLD_RANK) and the time, then exits with the same status.
int run_rank_wrapper(const std::vector<std::string>& program);

}  // namespace launcher
}  // namespace ddp
