// Which rank of a failed job failed first, and how, worked out from the job's output as ddprun relays it: the
// rank wrappers' exit markers, the runtime's error reports and mpirun's own reports. A job's first failure
// is its cause; the ranks that fail after it (torn down, or timed out waiting for it) are noise.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "launcher/relay.h"

namespace ddp {
namespace launcher {

// The line the rank wrapper prints when its program ends badly (rank_wrapper.h):
// "ddprun-exit: rank=R status=S time_ns=T stopped=0|1 asked=0|1": S the exit code, or 128 + signal; T a CLOCK_REALTIME
// time; stopped=1 when the wrapper had been sent SIGINT/SIGTERM before the program ended (mpirun tearing the
// job down after another rank failed, or ddprun stopping it), so this rank's end is a consequence, not a cause,
// and when the program stopped as asked (status ddp::kStoppedExitStatus); asked=1: asked_to_stop below.
struct ExitMarker {
  int rank = -1;
  int status = 0;
  long long time_ns = 0;
  bool stopped = false;
  // The program itself was asked to stop (a stop signal sent to it, not through its wrapper), or its stop
  // failed (ddp::kStopFailedExitStatus): a stop, never restarted.
  bool asked_to_stop = false;
};
std::string exit_marker(const ExitMarker& marker);
// The marker in a line, tagged or not; empty for any other line.
std::optional<ExitMarker> parse_exit_marker(const std::string& raw_line);

// How long mpirun may take to relay a line (its I/O forwarding, on a loaded machine): a rank's error line
// that arrives up to this long after another rank's exit may still have been printed first.
constexpr long long kRelaySlackNs = 1000000000LL;

// Watches the job's output for the rank whose failure started it all. Each kind of evidence carries a time:
//   - crashes: exit markers with a signal (SIGKILL, SIGSEGV, the OOM killer) the launcher did not send;
//   - error reports: the runtime's first "rank R: error:/fatal:" line, or for an error every rank raised
//     together ("error: WHAT:" then "  rank R: ..." / "  ranks R,S: ..."), the first rank it lists; the rank
//     is the one mpirun's tag names (the process that printed it), not the number in the text, which a
//     program can get wrong; its time is when ddprun read it;
//   - exits: exit markers with a non-zero status.
// The earliest wins, except that an exit must come more than kRelaySlackNs before an error report to beat it
// (ranks leave with a status right after another rank reports an error, and their markers may overtake it).
// Markers of stopped ranks (stopped=1) never count: mpirun's teardown stops every rank at about the same
// time. Last resort: mpirun's own reports ("Process name: [[J,1],R]", "process rank R with PID",
// "MPI_ABORT was invoked on rank R"), which name the first rank to exit, not the cause.
class FailureTracker {
 public:
  // `arrival_ns`: when ddprun read the line (CLOCK_REALTIME, the clock of the wrappers' markers).
  void observe(const std::string& raw_line, long long arrival_ns);
  std::optional<int> first_failed_rank() const;
  // "exit status 3" or "signal 9" for the first failed rank when its wrapper reported it, else empty.
  std::string first_failure_how() const;
  // The host whose Open MPI daemon mpirun lost ("Remote daemon: [[J,0],D] on node HOST"): the node went down,
  // or its connection did; empty when none was.
  const std::string& lost_host() const { return lost_host_; }
  // Ranks whose program stopped as asked (exit status ddp::kStoppedExitStatus, which the wrapper reports in
  // its marker and turns into 0 for mpirun, so that mpirun does not take it for a failure). Each rank counts
  // once, however many times its marker is seen (relayed by mpirun and read from the exit directory).
  int ranks_stopped_as_asked() const { return static_cast<int>(ranks_stopped_as_asked_.size()); }
  // Ranks whose marker says the program itself was asked to stop (ExitMarker::asked_to_stop), each once.
  int ranks_asked_to_stop() const { return static_cast<int>(ranks_asked_to_stop_.size()); }
  void reset() { *this = FailureTracker(); }

 private:
  struct Evidence {
    int rank = -1;
    long long time_ns = 0;
  };
  void observe_marker(const ExitMarker& marker);
  void observe_lost_host(const TaggedLine& line);
  void observe_mpirun_report(const TaggedLine& line);
  void observe_report(const TaggedLine& line, long long arrival_ns);
  std::optional<Evidence> crash_;
  std::optional<Evidence> exit_;
  std::optional<Evidence> report_;
  // After an "error: WHAT:" line: the rank that printed it, whose next "  rank R: ..." line names the cause.
  std::optional<int> agreed_error_printer_;
  std::optional<int> from_mpirun_;
  std::string lost_host_;
  std::set<int> ranks_stopped_as_asked_;
  std::set<int> ranks_asked_to_stop_;
  std::map<int, int> status_of_;  // rank -> status of its first failure marker that was not a stop
};

}  // namespace launcher
}  // namespace ddp
