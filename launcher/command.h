// ddprun's decisions, kept free of side effects so they can be unit-tested: parsing its command line, building
// the mpirun command from the options and the facts of the machine, warning of a job the node cannot hold,
// rewriting mpirun's output tags, and working out from the job's output which rank failed first.
//
// Why mpirun underneath: it already starts ranks on one or many nodes, wires up MPI (which bootstraps NCCL
// here), binds processes to cores, and tears the job down when one rank dies. ddprun adds the defaults a
// training job wants (one rank per GPU, sane binding, root and oversubscription handled, DDP_*/NCCL_* variables
// forwarded), readable "[rank R] " prefixes, a clear account of failures, and restarts from checkpoints.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "launcher/hosts.h"

namespace ddp {
namespace launcher {

constexpr int kDefaultRankMemoryMib = 400;
// How long a graceful stop may take before ddprun ends the job: inside Slurm's default KillWait (30 s between
// SIGTERM and SIGKILL at a time limit); --stop-grace sets another.
constexpr int kDefaultStopGraceS = 25;
constexpr int kMaxStopGraceS = 86400;  // a day: longer is no graceful stop
// More ranks than this per core draws a warning: they would mostly wait for a core (see resource_warnings).
constexpr int kMaxRanksPerCore = 4;
// OpenBLAS's kernel for the ranks where the user names none (OPENBLAS_CORETYPE) and the CPU has AVX2 and FMA:
// left to itself, OpenBLAS picks by the CPU (Cooperlake, SkylakeX, Zen...), and each kernel sums the products in
// its own order, so the same job would give other bits on another machine, and the CPU records
// (tests/examples/train_mlp_outputs.cpu.txt) hold only on the Haswell kernel's. OpenBLAS reads the variable once,
// when it is loaded, so it must be in the ranks' environment before they start. tools/test.sh reads this line.
constexpr const char* kOpenBlasCoreType = "Haswell";

struct LaunchOptions {
  int np = 0;  // 0: not given (the default is decided from the machine)
  std::string hosts;     // "h1:4,h2:4"
  std::string hostfile;  // Open MPI host file
  std::string backend;   // "", "nccl" or "mpi" (passed as DDP_BACKEND)
  int max_restarts = 0;
  // Elastic restarts: a restart goes on without the hosts it cannot reach when at least this many ranks fit on
  // the others (0: every rank, so a lost host ends the job).
  int min_np = 0;
  // A rank's peak memory, for the warning when the ranks would not fit in this node's memory. The default is
  // train_mlp's default model on CPU (about 400 MiB a rank, VmHWM); other programs should pass their own.
  int rank_memory_mib = kDefaultRankMemoryMib;
  // Seconds from the signal that asks the job to stop to ddprun ending it (the time every rank has to reach
  // the agreed step and write its checkpoint).
  int stop_grace_s = kDefaultStopGraceS;
  bool dry_run = false;
  std::vector<std::string> program;  // PROGRAM ARGS...
};

// What the command depends on, gathered by ddprun at start (and made up by tests).
struct MachineFacts {
  int gpus = 0;   // CUDA devices on this node
  int cores = 1;  // physical cores this process may run on
  std::vector<int> numa_cores;  // of those, per NUMA node (HostFacts)
  std::vector<int> gpu_numa;    // NUMA node of each GPU (HostFacts)
  // The job's hosts (--hosts/--hostfile) as their probes described them, in the host list's order; empty when
  // they were not asked (--dry-run): each is then taken to be like this node.
  std::vector<HostFacts> hosts;
  bool root = false;
  long long memory_available_bytes = 0;  // MemAvailable of /proc/meminfo; 0: unknown
  bool avx2_fma = false;  // the CPU runs OpenBLAS's kOpenBlasCoreType kernel (x86-64 with AVX2 and FMA)
  std::map<std::string, std::string> env;
};
MachineFacts current_machine();

// "h1:4,h2:4" (":N" optional, default 1 slot); throws InvalidArgument on a malformed entry.
std::vector<HostSlots> parse_hosts(const std::string& spec);
// The hosts of an Open MPI host file ("host [slots=N] ..." lines, '#' comments; 1 slot when not given), and
// their total slots. Throw InvalidArgument naming the file when it cannot be read or holds no host.
std::vector<HostSlots> parse_hostfile(const std::string& path);
int hostfile_slots(const std::string& path);
// The hosts of --hosts or --hostfile; empty for a job on this node.
std::vector<HostSlots> job_hosts(const LaunchOptions& options);

// The outcome of parsing ddprun's own command line.
struct ParsedCommandLine {
  std::optional<LaunchOptions> options;  // empty: exit with exit_code (after --help, or an error)
  int exit_code = 0;
};
// Parses argv (argv[0] included). Help goes to `out`, errors (with a pointer to --help) to `err`.
ParsedCommandLine parse_command_line(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// The number of ranks to start: -np, else the host list's slots, else the node's GPUs, else 2.
int resolve_np(const LaunchOptions& options, const MachineFacts& facts);

// The open files mpirun needs on this node to start `ranks_here` ranks (its own, and per rank the pipes and
// sockets of the rank and its wrapper), with some room: below it, mpirun starts no rank and waits forever.
long long open_files_needed(int ranks_here);
// Why an open-files limit (ulimit -n) of `limit` cannot start `ranks_here` ranks, naming the limit and what to
// do; "" when it can.
std::string open_files_refusal(int ranks_here, long long limit);

// Warnings, printed before the job starts, for a job on this node alone that the node cannot carry: more than
// kMaxRanksPerCore ranks per core, or ranks whose estimated memory (np x rank_memory_mib) exceeds what is
// available. Warnings only: the job still runs (a user may know better, e.g. ranks that mostly sleep). Jobs
// over --hosts/--hostfile are not checked: the other nodes' cores and memory are not visible from here.
std::vector<std::string> resource_warnings(const LaunchOptions& options, const MachineFacts& facts);

// The full mpirun argv. `extra_env` is set in every rank (`-x K=V`) on top of what is forwarded (restarts use
// it for DDP_RESTART and DDP_RESUME). Throws InvalidArgument for inconsistent options.
// With a non-empty `rank_wrapper` (ddprun's own path) each rank runs as
// "RANK_WRAPPER --ddprun-rank-wrapper -- PROGRAM ARGS" so its exit is reported with a time stamp; the wrapper
// must exist at the same path on every node, like the program.
std::vector<std::string> build_mpirun_command(const LaunchOptions& options, const MachineFacts& facts,
                                              const std::map<std::string, std::string>& extra_env = {},
                                              const std::string& rank_wrapper = "");
constexpr const char* kRankWrapperFlag = "--ddprun-rank-wrapper";
// The mpirun command that starts `probe` (ddprun's own path) with kProbeFlag once on `host` (hosts.h). With a
// `session_base`, that mpirun keeps its session directory under it instead of the shared TMPDIR: the probes of
// all hosts run at once, and mpiruns of one machine sharing TMPDIR race on its top directory (one removes it
// at exit while another creates its own: "A call to mkdir was unable to create the desired directory").
std::vector<std::string> build_probe_command(const std::string& host, const MachineFacts& facts,
                                             const std::string& probe, const std::string& session_base = "");

// Before each attempt of a job over several hosts: what the probes found, and which hosts and how many ranks
// the attempt runs with. Hosts that did not answer are dropped when --min-np allows (np becomes the smaller of
// -np and the slots left, at least --min-np); a host that answers again is taken back, up to the original np.
struct HostAnswer {
  bool reachable = false;
  HostFacts facts;
  std::string error;  // why not, from mpirun's output
};
struct AttemptPlan {
  LaunchOptions options;            // for this attempt: --hosts of the hosts kept, np set, when some were dropped
  std::vector<HostFacts> facts;     // of the hosts kept, in order
  std::vector<std::string> lost;    // "host (why)" of each host dropped
  std::string refusal;              // non-empty: too few ranks left; the job cannot (re)start
};
AttemptPlan plan_attempt(const LaunchOptions& options, const MachineFacts& facts,
                         const std::vector<HostAnswer>& answers);

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

// mpirun's tagged output (--tag-output) as whole lines, each of one rank and stream. mpirun tags what a rank
// writes as it reads it, so a line a rank writes in pieces ("part-one ", then "part-two\n") reaches the pipe in
// pieces, each tagged, with other ranks' pieces in between:
//   [1,1]<stdout>:part-one [1,0]<stdout>:part-one [1,1]<stdout>:part-two\n[1,0]<stdout>:part-two\n
// Fed the bytes of one of mpirun's pipes as they come, this keeps a line under way per rank and stream and
// returns each line once it is whole, with its tag ("[1,1]<stdout>:part-one part-two"); mpirun's own untagged
// lines come back as they are. A carriage return in a rank's line ends a redraw (a progress bar drawn in place:
// "[1,0]<stdout>:[###...] step 5\r"): returned at once with its '\r' and without a newline (is_redraw), so that
// the bar moves as the rank draws it; "\r\n" is an ordinary line end.
class TaggedLineJoiner {
 public:
  // A line the joiner returned that is a redraw: it ends with '\r' and is written without a newline.
  static bool is_redraw(const std::string& line) { return !line.empty() && line.back() == '\r'; }
  // The lines that `bytes` completes, in the order they were completed.
  std::vector<std::string> feed(const std::string& bytes);
  // At the end of the stream: what is left, lines without their newline.
  std::vector<std::string> finish();

 private:
  std::string pending_;         // bytes not yet taken apart (the start of what may be a tag)
  std::string current_tag_;     // the tag whose piece runs on, or "" between pieces
  std::string untagged_;        // an untagged line under way
  std::vector<std::pair<std::string, std::string>> partial_;  // (tag, the line so far), in order of first piece
};

// mpirun's own banners about a job's end, which ddprun says in one line of its own (the rank that failed first
// and how): "MPI_ABORT was invoked on rank R", "Primary job terminated normally, but 1 process returned a
// non-zero exit code", "mpirun detected that one or more processes exited with non-zero status", "mpirun
// noticed that process rank R ... exited on signal", "... exiting improperly", each a block between lines of
// dashes, and the lines around them (ORTE_ERROR_LOG, "N more processes have sent help message", "Set MCA
// parameter orte_base_help_aggregate"). Fed mpirun's untagged lines in order, it returns those to print: a
// block is held until it closes, then dropped when it is one of these and returned whole otherwise (mpirun's
// other messages, such as a program it cannot start, say what to fix). The FailureTracker still sees every line.
class MpirunBannerFilter {
 public:
  std::vector<std::string> feed(const std::string& untagged_line);
  // At the end of the stream: a block never closed, whole.
  std::vector<std::string> finish();

 private:
  bool in_block_ = false;
  std::vector<std::string> block_;
};

// The line the rank wrapper prints when its program ends badly (see job.h):
// "ddprun-exit: rank=R status=S time_ns=T stopped=0|1": S the exit code, or 128 + signal; T a CLOCK_REALTIME
// time; stopped=1 when the wrapper had been sent SIGINT/SIGTERM before the program ended (mpirun tearing the
// job down after another rank failed, or ddprun stopping it), so this rank's end is a consequence, not a cause,
// and when the program stopped as asked (status ddp::kStoppedExitStatus).
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
