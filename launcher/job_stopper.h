// How ddprun ends a job, gracefully first: a stop asked of every rank where it can be taken, then SIGTERM and
// SIGKILL to mpirun's process group when the stop takes too long or ddprun is told again. Kept apart from the
// loop that relays the job's output, which only tells it what happened and when.
#pragma once

#include <sys/types.h>

#include <set>

#include "launcher/clock.h"

namespace ddp {
namespace launcher {

// How long mpirun has to end its ranks after SIGTERM before SIGKILL follows.
constexpr int kStopGraceMs = 5000;

// Ends the job once asked. SIGTERM, SIGINT or SIGUSR1 first ask for a graceful stop: SIGUSR1 to this node's
// rank wrappers and to mpirun, which passes it to the ranks of the other nodes (not every build of Open MPI
// forwards SIGUSR1; a wrapper asked twice passes it on once) (the programs that handle it finish their step,
// write a checkpoint and exit with ddp::kStoppedExitStatus). The request is held until the job can take it: a
// process gets SIGUSR1 only once it catches it (before, it would die of it), and wrappers that start later
// (a signal in ddprun's first moments, or right after a restart) get it when they appear; mpirun, for the
// ranks of other nodes, gets it again every second. If the job is still there `graceful_ms` after the signal
// (ddprun --stop-grace), or at the next signal, it is ended: SIGTERM to mpirun's process group (mpirun then
// kills its ranks, in about 2 s), and SIGKILL kStopGraceMs later or at a further signal. Any other signal, or
// a closed output, ends it at once the same way. A SIGKILLed mpirun does not leave its ranks behind: their
// wrappers die with it (PR_SET_PDEATHSIG), and the programs with them.
class JobStopper {
 public:
  // `other_hosts`: the job has ranks on other nodes, which only mpirun can reach.
  JobStopper(pid_t group, int graceful_ms, bool other_hosts)
      : group_(group), graceful_ms_(graceful_ms), other_hosts_(other_hosts) {}
  // A signal to ddprun: the first stops the job (gracefully when it can be asked to), each further one hurries.
  void on_signal(int sig);
  // Hands a graceful stop to the processes that can take it now and have not had it yet (called on every turn
  // of the loop; does something at most every kStopRedeliveryMs).
  void deliver_stop_request();
  // Every rank has ended while the job was stopping: mpirun's own teardown is all that is left, and nothing of it
  // is worth waiting for (a Slurm job's signal to mpirun stretches it to about the stop grace). The stop itself is
  // not escalated: the ranks' own statuses say how it went.
  void kill_ended_job();
  // Ending the job at once for a reason of ddprun's own (not a signal: no stop is reported, the job failed).
  void end_job();
  // Ending the job for `why` at once (idempotent: a second closed stream is no reason to hurry).
  void stop(int why);
  void kill_if_overdue();
  // How long poll() may sleep: until the deadline while stopping, else `idle_ms`.
  int poll_timeout_ms(int idle_ms) const;
  int why() const { return why_; }
  // True while the job was only asked to stop (not terminated): its own exit status then says how it ended.
  bool only_asked() const { return graceful_ && !terminating_; }
  // Milliseconds from the first signal to now.
  long long ms_since_signal() const { return why_ == 0 ? 0 : monotonic_ms() - signalled_ms_; }

 private:
  void terminate();
  void kill_now();
  pid_t group_;
  int graceful_ms_;
  bool other_hosts_;
  int why_ = 0;
  bool graceful_ = false;
  bool terminating_ = false;
  bool killed_ = false;
  long long deadline_ms_ = 0;
  long long signalled_ms_ = 0;
  long long next_delivery_ms_ = 0;
  long long next_mpirun_delivery_ms_ = 0;
  std::set<pid_t> told_;  // local wrappers handed the graceful stop
};

}  // namespace launcher
}  // namespace ddp
