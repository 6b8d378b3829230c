// ddprun's decisions, kept free of side effects so they can be unit-tested: parsing its command line, building
// the mpirun command from the options and the facts of the machine, rewriting mpirun's output tags, and working
// out from the job's output which rank failed first.
//
// Why mpirun underneath: it already starts ranks on one or many nodes, wires up MPI (which bootstraps NCCL
// here), binds processes to cores, and tears the job down when one rank dies. ddprun adds the defaults a
// training job wants (one rank per GPU, sane binding, root and oversubscription handled, DDP_*/NCCL_* variables
// forwarded), readable "[rank R] " prefixes, a clear account of failures, and restarts from checkpoints.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

struct LaunchOptions {
  int np = 0;  // 0: not given (the default is decided from the machine)
  std::string hosts;     // "h1:4,h2:4"
  std::string hostfile;  // Open MPI host file
  std::string backend;   // "", "nccl" or "mpi" (passed as DDP_BACKEND)
  int max_restarts = 0;
  bool dry_run = false;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

// What the command depends on, gathered by ddprun at start (and made up by tests).
struct MachineFacts {
  int gpus = 0;   // CUDA devices on this node
  int cores = 1;  // physical cores this process may run on
  bool root = false;
  std::map<std::string, std::string> env;
};
MachineFacts current_machine();

struct HostSlots {
  std::string host;
  int slots = 1;
};
// "h1:4,h2:4" (":N" optional, default 1 slot); throws InvalidArgument on a malformed entry.
std::vector<HostSlots> parse_hosts(const std::string& spec);
// Total slots in an Open MPI host file ("host [slots=N] ..." lines, '#' comments; 1 slot when not given).
// Throws InvalidArgument naming the file when it cannot be read or holds no host.
int hostfile_slots(const std::string& path);

// The outcome of parsing ddprun's own command line.
struct ParsedCommandLine {
  std::optional<LaunchOptions> options;  // empty: exit with exit_code (after --help, or an error)
  int exit_code = 0;
};
// Parses argv (argv[0] included). Help goes to `out`, errors (with a pointer to --help) to `err`.
ParsedCommandLine parse_command_line(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// The number of ranks to start: -np, else the host list's slots, else the node's GPUs, else 2.
int resolve_np(const LaunchOptions& options, const MachineFacts& facts);

// The full mpirun argv. `extra_env` is set in every rank (`-x K=V`) on top of what is forwarded (restarts use
// it for DDP_RESTART and DDP_RESUME). Throws InvalidArgument for inconsistent options.
// With a non-empty `rank_wrapper` (ddprun's own path) each rank runs as
// "RANK_WRAPPER --ddprun-rank-wrapper -- PROGRAM ARGS" so its exit is reported with a time stamp; the wrapper
// must exist at the same path on every node, like the program.
std::vector<std::string> build_mpirun_command(const LaunchOptions& options, const MachineFacts& facts,
                                              const std::map<std::string, std::string>& extra_env = {},
                                              const std::string& rank_wrapper = "");
constexpr const char* kRankWrapperFlag = "--ddprun-rank-wrapper";

// POSIX shell quoting, so --dry-run output can be pasted into a shell.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);

// One line of mpirun --tag-output output: "[1,3]<stderr>:text" becomes rank 3, stream "stderr", text "text".
struct TaggedLine {
  bool tagged = false;
  int rank = -1;
  std::string stream;  // "stdout", "stderr" or "stddiag"
  std::string text;    // the whole line when untagged
};
TaggedLine parse_tagged_line(const std::string& line);
// "[1,3]<stdout>:text" -> "[rank 3] text"; untagged lines are returned unchanged.
std::string rewrite_tagged_line(const std::string& line);

// The line the rank wrapper prints when its program ends badly (see job.h):
// "ddprun-exit: rank=R status=S time_ns=T" (S: the exit code, or 128 + signal), T a CLOCK_REALTIME time.
std::string exit_marker(int rank, int status, long long time_ns);
// True (and the fields filled) for a line, tagged or not, that holds an exit marker.
bool parse_exit_marker(const std::string& raw_line, int* rank, int* status, long long* time_ns);

// Watches the job's output for the first rank to fail. Most reliable are the rank wrappers' exit markers (the
// earliest time wins: mpirun's own report is not always printed when ranks die together); next mpirun's
// reports ("Process name: [[J,1],R]", "process rank R with PID", "MPI_ABORT was invoked on rank R"); last the
// first "rank R: error:" / "rank R: fatal:" line the runtime printed.
class FailureTracker {
 public:
  void observe(const std::string& raw_line);
  std::optional<int> first_failed_rank() const;
  // "exit status 3" or "signal 9" when a wrapper reported it, else empty.
  std::string first_failure_how() const;
  void reset() { *this = FailureTracker(); }

 private:
  std::optional<int> from_marker_;
  int marker_status_ = 0;
  long long marker_time_ = 0;
  std::optional<int> from_mpirun_;
  std::optional<int> from_runtime_;
};

}  // namespace launcher
}  // namespace ddp
