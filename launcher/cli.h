// ddprun's command line: its options as the rest of the launcher reads them, and the parsing that refuses a
// bad one with a message that says what to write instead. Pure, so every refusal is unit-tested.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

constexpr int kDefaultRankMemoryMib = 400;
// How long a graceful stop may take before ddprun ends the job: inside Slurm's default KillWait (30 s between
// SIGTERM and SIGKILL at a time limit); --stop-grace sets another.
constexpr int kDefaultStopGraceS = 25;
constexpr int kMaxStopGraceS = 86400;  // a day: longer is no graceful stop

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

// The outcome of parsing ddprun's own command line.
struct ParsedCommandLine {
  std::optional<LaunchOptions> options;  // empty: exit with exit_code (after --help, or an error)
  int exit_code = 0;
};
// Parses argv (argv[0] included). Help goes to `out`, errors (with a pointer to --help) to `err`.
ParsedCommandLine parse_command_line(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

}  // namespace launcher
}  // namespace ddp
