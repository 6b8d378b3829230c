// Running the mpirun command as a child: its output relayed line by line with "[rank R] " prefixes, the first
// failing rank noted, the job ended whatever ends ddprun, and its exit status returned.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/cli.h"

namespace ddp {
namespace launcher {

class CaughtSignals;

struct JobResult {
  int exit_status = 0;  // the child's exit code, or 128 + signal number
  std::optional<int> first_failed_rank;
  std::string first_failure_how;  // "exit status 3", "signal 9", or empty when unknown
  std::string lost_host;          // a host mpirun lost its daemon on (FailureTracker::lost_host), or empty
  // Why ddprun ended the job itself: the signal it received (SIGINT, SIGTERM, SIGHUP, SIGQUIT, ...), or SIGPIPE
  // when its own stdout or stderr was closed under it; 0 when the job ended by itself. No restart then.
  int stopped_by = 0;
  // The job was only asked to stop (a graceful stop, never escalated): exit_status says whether it did.
  bool stop_only_asked = false;
  double stop_seconds = 0;  // from ddprun's first signal to the job's end
  int ranks_stopped_as_asked = 0;  // ranks whose program exited with ddp::kStoppedExitStatus
  // Ranks whose program was itself asked to stop (a stop signal sent to it, or a stop that failed:
  // ddp::kStopFailedExitStatus): the job is not restarted, however it ended.
  int ranks_asked_to_stop = 0;
  // Not empty when ddprun ended the job because its ranks did not get through MPI_Init in time (start_watch.h).
  std::string start_failure;
};

// Raises this process's open-files limit (its soft limit, up to the hard one) as far as `ranks_here` ranks
// need (open_files_needed); the refusal (open_files_refusal) when even the hard limit is too low, else "".
std::string ensure_open_files(int ranks_here);

// Runs `argv` (argv[0] is looked up in PATH) with stdout and stderr through pipes, relaying each line to this
// process's stdout or stderr (the stream the rank wrote to) after rewrite_tagged_line. Throws ddp::Error when
// the process cannot be started.
// Exit markers of the rank wrappers are consumed here, not relayed; the wrappers of this node also leave them
// in a private directory (DDPRUN_EXIT_DIR in mpirun's environment), read once mpirun has ended, since a
// signalled mpirun (Slurm signals every process of a job) stops relaying its ranks' output.
// No process of the job may outlive ddprun: the child runs in a process group of its own. The first SIGTERM,
// SIGINT or SIGUSR1 asks for a graceful stop: SIGUSR1 to mpirun, which passes it to every rank's wrapper, which
// passes it to a program that handles it (train_mlp finishes its step on every rank, writes a checkpoint and
// exits with ddp::kStoppedExitStatus) or SIGTERM to one that does not. A job still running `stop_grace_ms`
// later (ddprun --stop-grace), a second signal, any other signal that would end ddprun (SIGHUP, SIGQUIT,
// SIGALRM, ...), or EPIPE on its output (SIGPIPE is ignored) sends SIGTERM to the group, which mpirun answers
// by killing its ranks; SIGKILL follows after kStopGraceMs (job_stopper.h) or at a further signal. If ddprun
// itself is SIGKILLed, the child gets SIGTERM by PR_SET_PDEATHSIG. SIGUSR2 goes to mpirun instead, which
// passes it to every rank (a dump of its flight recorder; the job goes on). run_job returns once the child has
// been reaped.
//
// With `signals`, the signals it holds (some perhaps caught before this call) are this job's; without, run_job
// catches them itself while it runs.
// `stop_grace_ms`: how long a graceful stop may take before the job is ended (ddprun --stop-grace).
// `ranks`: the job's world size, for the watch over its start (start_watch.h); 0 watches nothing.
JobResult run_job(const std::vector<std::string>& argv, int stop_grace_ms = kDefaultStopGraceS * 1000,
                  CaughtSignals* signals = nullptr, int ranks = 0);

}  // namespace launcher
}  // namespace ddp
