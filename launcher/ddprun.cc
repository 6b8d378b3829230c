// ddprun: the one command a user types to start (and, with --max-restarts, keep restarting) a training job.
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/attempt.h"
#include "launcher/caught_signals.h"
#include "launcher/cli.h"
#include "launcher/command.h"
#include "launcher/dump.h"
#include "launcher/hosts.h"
#include "launcher/job.h"
#include "launcher/machine.h"
#include "launcher/probe.h"
#include "launcher/rank_wrapper.h"
#include "launcher/resources.h"
#include "launcher/shell_quote.h"
#include "launcher/slurm.h"
#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/core/stop_request.h"

namespace {

std::string rank_text(const ddp::launcher::JobResult& r) {
  if (!r.lost_host.empty()) return "host " + r.lost_host + " lost: mpirun lost its daemon there";
  if (!r.first_failed_rank) return "first failed rank unknown";
  return "rank " + std::to_string(*r.first_failed_rank) + " first" +
         (r.first_failure_how.empty() ? "" : ", " + r.first_failure_how);
}

// "received SIGTERM", or for SIGPIPE what it stands for here.
std::string stop_reason(int sig) {
  if (sig == SIGPIPE) return "its output was closed (broken pipe)";
  const char* name = ::sigabbrev_np(sig);
  return name != nullptr ? "received SIG" + std::string(name) : "received signal " + std::to_string(sig);
}

// Our own executable, so every rank can run through the wrapper.
std::string self_path() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  return std::string(path, static_cast<size_t>(n));
}

// The hosts this attempt runs on, from asking each host of the job (hosts.h): `options` itself when all
// answer, fewer hosts when some do not and --min-np allows, or a refusal.
ddp::launcher::AttemptPlan plan_hosts(const ddp::launcher::LaunchOptions& options,
                                      ddp::launcher::MachineFacts* facts, const std::string& self) {
  using namespace ddp::launcher;
  AttemptPlan plan = plan_attempt(options, *facts, probe_hosts(job_hosts(options), *facts, self));
  if (!plan.refusal.empty()) return plan;
  facts->hosts = plan.facts;
  if (!plan.lost.empty()) {
    std::string lost;
    for (const std::string& l : plan.lost) lost += (lost.empty() ? "" : ", ") + l;
    std::fprintf(stderr, "ddprun: cannot reach %s; going on with %d rank%s on %s (--min-np %d)\n", lost.c_str(),
                 plan.options.np, plan.options.np == 1 ? "" : "s", plan.options.hosts.c_str(), options.min_np);
  }
  return plan;
}

std::string this_host() {
  char name[256] = {0};
  return ::gethostname(name, sizeof name - 1) == 0 ? name : "";
}

// Inside a Slurm allocation: the job the allocation makes of `options` (docs/slurm.md), said on stderr; empty
// when the allocation cannot hold it (the refusal said).
std::optional<ddp::launcher::LaunchOptions> within_allocation(const ddp::launcher::LaunchOptions& options,
                                                              const ddp::launcher::MachineFacts& facts) {
  using namespace ddp::launcher;
  const std::optional<SlurmAllocation> allocation = slurm_allocation(facts.env);
  if (!allocation) return options;
  const SlurmPlan plan = plan_in_allocation(options, *allocation, this_host());
  if (!plan.refusal.empty()) {
    std::fprintf(stderr, "ddprun: error: %s\n", plan.refusal.c_str());
    return std::nullopt;
  }
  std::fprintf(stderr, "%s\n", plan.announcement.c_str());
  if (!plan.note.empty()) std::fprintf(stderr, "%s\n", plan.note.c_str());
  return plan.options;
}

// Why `program` cannot be run on this node ("No such file or directory"), or "" when it can: the rank wrappers
// would each say so, one line per rank. Searched on PATH as execvp does when it names no directory.
std::string cannot_run(const std::string& program) {
  auto runnable = [](const std::string& path) -> std::string {
    if (::access(path.c_str(), F_OK) != 0) return ::strerror(errno);
    if (::access(path.c_str(), X_OK) != 0) return "it is not executable (chmod +x)";
    return "";
  };
  if (program.find('/') != std::string::npos) return runnable(program);
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (size_t start = 0; start <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, colon - start);
    if (runnable((dir.empty() ? "." : dir) + "/" + program).empty()) return "";
    start = colon + 1;
  }
  return "no such program on PATH";
}

void warn_of_resources(const ddp::launcher::LaunchOptions& options, const ddp::launcher::MachineFacts& facts) {
  for (const std::string& warning : ddp::launcher::resource_warnings(options, facts)) {
    std::fprintf(stderr, "ddprun: warning: %s\n", warning.c_str());
  }
}

// --dry-run: the mpirun command, printed instead of run.
int dry_run(const ddp::launcher::LaunchOptions& options, const ddp::launcher::MachineFacts& facts,
            bool several_hosts, const std::string& self) {
  using namespace ddp::launcher;
  if (several_hosts) {
    std::fprintf(stderr, "ddprun: --dry-run does not ask the hosts; the binding below takes each to be like this "
                         "node (%d cores, %d GPUs)\n", facts.cores, facts.gpus);
  }
  std::cout << shell_join(build_mpirun_command(options, facts, {}, self)) << "\n";
  return 0;
}

// ddprun's exit status when this node cannot start the job at all, said on stderr; empty when it can.
std::optional<int> refuse_before_start(const ddp::launcher::LaunchOptions& options,
                                       const ddp::launcher::MachineFacts& facts, bool several_hosts) {
  using namespace ddp::launcher;
  // On this node alone the program is looked for once, here (on several hosts it may exist only on the others).
  if (const std::string why = several_hosts || options.program.empty() ? "" : cannot_run(options.program[0]);
      !why.empty()) {
    std::fprintf(stderr, "ddprun: error: cannot run %s: %s; no rank was started\n", options.program[0].c_str(),
                 why.c_str());
    return 127;
  }
  // Too few open files: mpirun would start no rank and wait forever.
  const std::string few_files = ensure_open_files(several_hosts ? 1 : resolve_np(options, facts));
  if (!few_files.empty()) {
    std::fprintf(stderr, "ddprun: error: %s\n", few_files.c_str());
    return 1;
  }
  return std::nullopt;
}

// The variables an attempt sets in every rank on top of those forwarded.
std::map<std::string, std::string> attempt_environment(int attempt, const ddp::launcher::MachineFacts& facts) {
  std::map<std::string, std::string> extra;
  if (attempt > 0) {
    extra = {{std::string(ddp::settings::setting("DDP_RESTART").name), std::to_string(attempt)},
             {std::string(ddp::settings::setting("DDP_RESUME").name), "1"}};
  }
  // The ranks' output reaches the terminal through mpirun's pipes, so rank 0 cannot see that there is one:
  // told here, it draws its progress bar, which the relay passes through whole (a user's own setting wins).
  const std::string bar(ddp::settings::setting("DDP_PROGRESS_BAR").name);
  if (::isatty(STDOUT_FILENO) == 1 && facts.env.count(bar) == 0) {
    extra[bar] = "1";
  }
  return extra;
}

// ddprun's exit status when the job ended in a stop (asked by a signal to ddprun or to a rank), said on stderr;
// empty when it did not.
std::optional<int> stop_status(const ddp::launcher::JobResult& result, int np) {
  // Every rank stopped as asked: a graceful stop, whatever mpirun says (Slurm's SIGTERM to every process of
  // the job also reaches mpirun, which then reports the job as aborted).
  const bool every_rank_stopped = result.ranks_stopped_as_asked >= np;
  const bool stopped_as_asked = result.ranks_stopped_as_asked > 0 &&
                                (result.exit_status == 0 || result.exit_status == ddp::kStoppedExitStatus ||
                                 every_rank_stopped);
  // A signal that came once every rank had stopped as asked (a second SIGTERM while mpirun was tearing down)
  // ended nothing: the stop was finished.
  if (stopped_as_asked && (result.stopped_by == 0 || result.stop_only_asked || every_rank_stopped)) {
    // Stopped as asked, by ddprun's signal or by one sent to a rank: not a failure, and not restarted.
    if (result.stopped_by != 0) {
      std::fprintf(stderr, "ddprun: %s; the job stopped gracefully %.1f s after it; exit status %d\n",
                   stop_reason(result.stopped_by).c_str(), result.stop_seconds, ddp::kStoppedExitStatus);
    } else {
      std::fprintf(stderr, "ddprun: the job stopped gracefully (a rank was asked to stop); exit status %d, "
                   "not restarted\n", ddp::kStoppedExitStatus);
    }
    return ddp::kStoppedExitStatus;
  }
  if (result.stopped_by != 0 && result.stop_only_asked && result.exit_status == 0 &&
      result.ranks_stopped_as_asked == 0) {
    std::fprintf(stderr, "ddprun: %s, but the job finished before it could stop; exit status 0\n",
                 stop_reason(result.stopped_by).c_str());
    return 0;
  }
  if (result.stopped_by != 0) {
    // As a shell reports a program that a signal ended: 128 + the signal, whatever the job's own status.
    std::fprintf(stderr, "ddprun: %s; the job was ended (mpirun's status %d); exit status %d\n",
                 stop_reason(result.stopped_by).c_str(), result.exit_status, 128 + result.stopped_by);
    return 128 + result.stopped_by;
  }
  return std::nullopt;
}

// ddprun's exit status when the attempt that gave `result` is the job's last, said on stderr; empty when the
// job is to be restarted.
std::optional<int> final_status(const ddp::launcher::JobResult& result, const ddp::launcher::LaunchOptions& options,
                                int attempt, int np) {
  if (const std::optional<int> stopped = stop_status(result, np)) return stopped;
  if (result.exit_status == 0) return 0;
  if (result.ranks_asked_to_stop > 0) {
    // A rank was asked to stop (a signal to its program) and the job did not stop cleanly: still a stop.
    std::fprintf(stderr, "ddprun: the job was asked to stop (a signal to a rank) and did not stop cleanly (%s); "
                 "exit status %d, not restarted\n", rank_text(result).c_str(), result.exit_status);
    return result.exit_status;
  }
  if (attempt < options.max_restarts && result.exit_status == ddp::kInputErrorExitStatus) {
    // The ranks agreed that the job's input is wrong (ddp::AgreedError::kInput): a retry would meet it again.
    std::fprintf(stderr, "ddprun: job failed (%s) with exit status %d: its input is wrong (flags or data, as the "
                 "message above says), which a restart would meet again; not restarted\n",
                 rank_text(result).c_str(), result.exit_status);
    return result.exit_status;
  }
  if (attempt < options.max_restarts) return std::nullopt;
  std::fprintf(stderr, "ddprun: job failed (%s) with exit status %d%s\n",
               rank_text(result).c_str(), result.exit_status,
               options.max_restarts > 0 ? (", after " + std::to_string(options.max_restarts) + " restarts").c_str()
                                        : "");
  return result.exit_status;
}

// The job's attempts, the first and each restart, until one is the last; ddprun's exit status.
int run_attempts(const ddp::launcher::LaunchOptions& options, ddp::launcher::MachineFacts& facts,
                 bool several_hosts, const std::string& self, ddp::launcher::CaughtSignals& signals) {
  using namespace ddp::launcher;
  int last_status = 0;
  for (int attempt = 0;; ++attempt) {
    LaunchOptions run = options;
    if (several_hosts) {
      const AttemptPlan plan = plan_hosts(options, &facts, self);
      if (!plan.refusal.empty() && attempt == 0) {
        std::fprintf(stderr, "ddprun: error: cannot start the job: %s\n", plan.refusal.c_str());
        return 1;
      }
      if (!plan.refusal.empty()) {
        std::fprintf(stderr, "ddprun: not restarting: %s; exit status %d\n", plan.refusal.c_str(), last_status);
        return last_status;
      }
      run = plan.options;
    }
    const JobResult result = run_job(build_mpirun_command(run, facts, attempt_environment(attempt, facts), self),
                                     options.stop_grace_s * 1000, &signals, resolve_np(run, facts));
    last_status = result.exit_status;
    if (const std::optional<int> status = final_status(result, options, attempt, resolve_np(run, facts))) {
      return *status;
    }
    std::fprintf(stderr, "ddprun: job failed (%s); restart %d of %d\n", rank_text(result).c_str(), attempt + 1,
                 options.max_restarts);
  }
}

int launch(const ddp::launcher::LaunchOptions& requested) {
  using namespace ddp::launcher;
  // First: a stop asked while the machine and the hosts are looked at, or between attempts, is kept for the job.
  CaughtSignals signals;
  MachineFacts facts = current_machine();
  const std::optional<LaunchOptions> in_allocation = within_allocation(requested, facts);
  if (!in_allocation) return 1;
  const LaunchOptions& options = *in_allocation;
  warn_of_resources(options, facts);
  const bool several_hosts = !job_hosts(options).empty();
  const std::string self = self_path();
  if (options.dry_run) return dry_run(options, facts, several_hosts, self);
  if (const std::optional<int> refused = refuse_before_start(options, facts, several_hosts)) return *refused;
  return run_attempts(options, facts, several_hosts, self, signals);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  if (args.size() >= 3 && args[1] == ddp::launcher::kRankWrapperFlag && args[2] == "--") {
    return ddp::launcher::run_rank_wrapper(std::vector<std::string>(args.begin() + 3, args.end()));
  }
  if (args.size() == 2 && args[1] == ddp::launcher::kProbeFlag) {
    std::printf("%s\n", ddp::launcher::probe_line(ddp::launcher::host_facts_here()).c_str());
    return 0;
  }
  if (args.size() >= 2 && args[1] == "--dump") {
    return ddp::launcher::dump_job(std::vector<std::string>(args.begin() + 2, args.end()));
  }
  const ddp::launcher::ParsedCommandLine parsed = ddp::launcher::parse_command_line(args, std::cout, std::cerr);
  if (!parsed.options) return parsed.exit_code;
  try {
    return launch(*parsed.options);
  } catch (const ddp::InvalidArgument& e) {
    std::fprintf(stderr, "ddprun: error: %s\nRun ddprun --help for usage.\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 1;
  }
}
