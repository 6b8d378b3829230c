#include "launcher/job_stopper.h"

#include <signal.h>

#include <algorithm>

#include "launcher/caught_signals.h"
#include "launcher/process_tree.h"

namespace ddp {
namespace launcher {
namespace {

// How often a graceful stop is handed again to mpirun (for ranks on other nodes that did not exist yet; a
// wrapper asked twice passes it on once), and looked for new local wrappers.
constexpr int kStopRedeliveryMs = 100;
constexpr int kStopRedeliveryToMpirunMs = 1000;

}  // namespace

void JobStopper::on_signal(int sig) {
  if (why_ == 0) signalled_ms_ = monotonic_ms();
  if (why_ == 0 && asks_graceful_stop(sig)) {
    why_ = sig;
    graceful_ = true;
    deadline_ms_ = monotonic_ms() + graceful_ms_;
    deliver_stop_request();
  } else if (why_ != 0 && !terminating_) {
    terminate();
  } else if (why_ != 0) {
    kill_now();
  } else {
    stop(sig);
  }
}

void JobStopper::deliver_stop_request() {
  if (!graceful_ || terminating_) return;
  const long long now = monotonic_ms();
  if (now < next_delivery_ms_) return;
  next_delivery_ms_ = now + kStopRedeliveryMs;
  for (pid_t wrapper : local_rank_wrappers(group_)) {
    if (told_.count(wrapper) || !catches_signal(wrapper, kGracefulStopSignal)) continue;
    ::kill(wrapper, kGracefulStopSignal);
    told_.insert(wrapper);
  }
  // mpirun alone, not its group: the programs must not get it directly. Only for ranks on other nodes: here
  // the wrappers have it from us, each once it catches it (mpirun's copy could reach a wrapper too young to).
  if (other_hosts_ && now >= next_mpirun_delivery_ms_ && catches_signal(group_, kGracefulStopSignal)) {
    ::kill(group_, kGracefulStopSignal);
    next_mpirun_delivery_ms_ = now + kStopRedeliveryToMpirunMs;
  }
}

void JobStopper::kill_ended_job() {
  if (killed_) return;
  killed_ = true;
  ::killpg(group_, SIGKILL);
}

void JobStopper::end_job() {
  if (!terminating_) terminate();
}

void JobStopper::stop(int why) {
  if (terminating_) return;
  if (why_ == 0) {
    why_ = why;
    signalled_ms_ = monotonic_ms();
  }
  terminate();
}

void JobStopper::kill_if_overdue() {
  if ((why_ == 0 && !terminating_) || monotonic_ms() < deadline_ms_) return;
  if (!terminating_) {
    terminate();  // the graceful stop took too long
  } else {
    kill_now();
  }
}

int JobStopper::poll_timeout_ms(int idle_ms) const {
  if ((why_ == 0 && !terminating_) || killed_) return idle_ms;
  long long left = std::max(0LL, deadline_ms_ - monotonic_ms());
  if (graceful_ && !terminating_) left = std::min<long long>(left, kStopRedeliveryMs);
  return idle_ms < 0 ? static_cast<int>(left) : static_cast<int>(std::min<long long>(left, idle_ms));
}

void JobStopper::terminate() {
  terminating_ = true;
  ::killpg(group_, SIGTERM);
  deadline_ms_ = monotonic_ms() + kStopGraceMs;
}

void JobStopper::kill_now() {
  if (killed_) return;
  killed_ = true;
  ::killpg(group_, SIGKILL);
}

}  // namespace launcher
}  // namespace ddp
