// A deadline in the time this process ran. The collective timeout must not fire because the whole job was
// stopped (Ctrl-Z under ddprun, Slurm's `scontrol suspend`, a machine or VM that slept) and then continued:
// wall time ran on, but no rank was late. So deadlines count running time: steady time less the gaps in which
// the process did not run at all.
//
// A gap is seen from the readings of the clock: two readings further apart than kLongestRunningGapS mean the
// process (or every thread that reads the clock) did not run in between, and the gap is not counted. The waiters read it often (the
// watchdog every 50 ms, a blocking wait in its polling loop), so while a deadline runs, a long gap is a stop;
// a thread starved for more than the bound only moves its deadline later by that much. Ranks stopped one at a
// time still see each other late: only the stopped rank's own clock leaves its stop out.
#pragma once

#include <chrono>

namespace ddp {

// Longer than any pause of a running process between two readings of a waiter (scheduling, page faults).
inline constexpr double kLongestRunningGapS = 0.5;

// Seconds of running time since an arbitrary origin, for this process; thread-safe.
double running_seconds();

class Deadline {
 public:
  // `seconds` of running time from now.
  explicit Deadline(double seconds);
  bool passed() const;
  // Running seconds left (negative once passed).
  double seconds_left() const;

 private:
  double at_;
};

// Whether process `pid` of this node is stopped now (SIGSTOP, SIGTSTP, a debugger): a peer that cannot be late
// by its own doing. The state letter of /proc/PID/stat; false when it cannot be read.
bool process_stopped(int pid);

}  // namespace ddp
