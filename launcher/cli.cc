// The CLI11 description of ddprun's options, and the checks of combinations CLI11 cannot express.
#include "launcher/cli.h"

#include <CLI/CLI.hpp>
#include <memory>
#include <utility>

#include "launcher/hosts.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

// ddprun's help: its own usage lines (a job, or --dump) in place of CLI11's one "Usage: ddprun [OPTIONS]".
class DdprunHelp : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: ddprun [-np N] [--hosts h1:4,h2:4 | --hostfile F] [--backend nccl|mpi] [--max-restarts K]\n"
           "              [--min-np N] [--rank-memory-mib M] [--stop-grace S] [--dry-run] -- PROGRAM ARGS...\n"
           "       ddprun --dump [PID]\n";
  }
};


// A whole number from `low` to `high`, refused in words of its own: CLI11's range check would print its bound
// of 309 digits for "0", and its conversion "Could not convert" for "0.5" or "abc".
CLI::Validator whole_number(long long low, long long high, const std::string& unit) {
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        const std::string range = "a whole number of " + unit + " from " + std::to_string(low) + " to " +
                                  std::to_string(high);
        if (value.empty() || value.size() > 18 ||
            value.find_first_not_of("0123456789") != std::string::npos) {
          return "'" + value + "' is not " + range;
        }
        const long long n = std::stoll(value);
        if (n < low || n > high) return "'" + value + "' is not " + range;
        return "";
      },
      "");
}

// argv after argv[0], split at the first "--": ddprun's flags before it, the program and its arguments after.
void split_at_separator(const std::vector<std::string>& argv, std::vector<std::string>* flags,
                        std::vector<std::string>* program) {
  bool separator = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (!separator && argv[i] == "--") {
      separator = true;
    } else if (separator) {
      program->push_back(argv[i]);
    } else {
      // mpirun spells it -np; CLI11 allows only one letter after a single dash.
      flags->push_back(argv[i] == "-np" ? "--np" : argv[i].starts_with("-np=") ? "--np=" + argv[i].substr(4) : argv[i]);
    }
  }
}

// The options of a job, each bound to its field of `options`.
void add_job_options(CLI::App& app, LaunchOptions& options) {
  app.add_option("-n,--np", options.np,
                 "number of ranks (also -np); default: the host list's slots, else this node's GPUs, else 2");
  auto* hosts = app.add_option("--hosts", options.hosts, "nodes and slots, e.g. h1:4,h2:4 (mpirun --host)");
  auto* hostfile = app.add_option("--hostfile", options.hostfile, "an Open MPI host file (mpirun --hostfile)");
  hosts->excludes(hostfile);
  hostfile->excludes(hosts);
  app.add_option("--backend", options.backend, "gradient all-reduce backend, passed as DDP_BACKEND")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--max-restarts", options.max_restarts,
                 "relaunch a failed job up to K times with DDP_RESTART=<attempt> and DDP_RESUME=1 (the program "
                 "resumes from its latest complete checkpoint, or starts from scratch if it has none yet)")
      ->check(whole_number(0, 1000, "restarts"));
  app.add_option("--min-np", options.min_np,
                 "with --max-restarts over several hosts: a restart goes on without hosts that cannot be reached "
                 "when at least this many ranks fit on the others (the program resumes at the new world size)");
  app.add_option("--rank-memory-mib", options.rank_memory_mib,
                 "a rank's estimated peak memory, for the warning when the ranks would not fit in this node's "
                 "memory (0: no check)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--stop-grace", options.stop_grace_s,
                 "seconds a graceful stop may take (every rank reaching the agreed step and writing its "
                 "checkpoint) before the job is ended; under Slurm keep it below KillWait, or below N of "
                 "--signal=B:USR1@N")
      ->capture_default_str()
      ->check(whole_number(1, kMaxStopGraceS, "seconds"));
  app.add_flag("--dry-run", options.dry_run, "print the mpirun command and exit");
}

// --dump, taken before the rest (ddprun.cc): listed here so that --help shows it, refused among other flags.
void add_dump_option(CLI::App& app, std::vector<std::string>& dump) {
  app.add_option("--dump", dump,
                 "alone: every rank of the running job of ddprun PID (or of the one job of yours) prints its flight "
                 "recorder, its last collectives and its phase, and the job goes on (also: SIGUSR2 to ddprun)")
      ->option_text("[PID]")
      ->expected(0, 1);
}

// What --help says after the options.
void add_footer(CLI::App& app) {
  app.footer(
      "Each output line is prefixed with \"[rank R] \". DDP_* and NCCL_* variables are forwarded to every rank,\n"
      "and OPENBLAS_CORETYPE (Haswell where it is unset and the CPU has AVX2 and FMA, for the same bits anywhere).\n"
      "When ddprun's output is a terminal, rank 0 draws its progress bar (DDP_PROGRESS_BAR=0: plain lines).\n"
      "The exit status is the job's; on failure ddprun names the rank that failed first. SIGTERM, SIGINT or\n"
      "SIGUSR1 asks the job to stop gracefully (SIGUSR1 to every rank: train_mlp finishes its step, writes a\n"
      "checkpoint and exits 75, which ddprun passes on and never restarts); after --stop-grace seconds, or at a\n"
      "second signal, the job is ended and ddprun exits 128+S (SIGINT 130, SIGTERM 143; a closed output pipe\n"
      "141), as it does at once for other signals. Inside a Slurm allocation (sbatch, salloc) the nodes, tasks\n"
      "and the default -np come from the allocation (docs/slurm.md).\n\n"
      "Example: ddprun -np 2 -- bazel-bin/examples/train_mlp --epochs 1");
}

// Each value said in words with its default, instead of CLI11's type strings ("INT:NONNEGATIVE=400").
void name_values(CLI::App& app) {
  for (const auto& [name, value] : std::vector<std::pair<const char*, std::string>>{
           {"--np", "N"}, {"--hosts", "HOST:SLOTS,... (or --hostfile)"}, {"--hostfile", "FILE (or --hosts)"},
           {"--backend", "nccl|mpi"}, {"--max-restarts", "K (default 0)"}, {"--min-np", "N"},
           {"--rank-memory-mib", "MIB (default " + std::to_string(kDefaultRankMemoryMib) + ")"},
           {"--stop-grace", "SECONDS (default " + std::to_string(kDefaultStopGraceS) + ")"}}) {
    app.get_option(name)->option_text(value);
  }
}

// What is wrong with options CLI11 accepted, in the words of a refusal; "" when they make a job.
std::string problem_with(const CLI::App& app, const LaunchOptions& options) {
  std::string problem;
  if (app.count("--dump") > 0) {
    problem = "--dump goes alone: ddprun --dump [PID]";
  } else if (app.count("--np") > 0 && options.np <= 0) {
    problem = "-np must be a positive number of ranks, got " + std::to_string(options.np);
  } else if (app.count("--min-np") > 0 && options.min_np <= 0) {
    problem = "--min-np must be a positive number of ranks, got " + std::to_string(options.min_np);
  } else if (options.np > 0 && options.min_np > options.np) {
    problem = "--min-np " + std::to_string(options.min_np) + " is more than -np " + std::to_string(options.np) +
              ": the job could never start; give --min-np at most the number of ranks";
  } else if (options.program.empty()) {
    problem = "missing the program to run: ddprun [options] -- PROGRAM ARGS...";
  }
  if (problem.empty()) {
    try {
      if (!options.hosts.empty()) parse_hosts(options.hosts);
      if (!options.hostfile.empty()) hostfile_slots(options.hostfile);
    } catch (const InvalidArgument& e) {
      problem = e.what();
    }
  }
  return problem;
}

// The exit status of a command line CLI11 refused, the refusal said on `err`.
int refuse(const CLI::ParseError& e, std::ostream& err) {
  err << "ddprun: error: " << e.what() << "\n";
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    err << "ddprun: put the program and its arguments after --: ddprun [options] -- PROGRAM ARGS...\n";
  }
  err << "Run ddprun --help for usage.\n";
  return 2;
}

}  // namespace

ParsedCommandLine parse_command_line(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  ParsedCommandLine result;
  LaunchOptions options;
  std::vector<std::string> flags;
  split_at_separator(argv, &flags, &options.program);
  CLI::App app("ddprun: starts a data-parallel training job, one rank per GPU (or CPU ranks), through mpirun.",
               "ddprun");
  app.formatter(std::make_shared<DdprunHelp>());
  add_job_options(app, options);
  std::vector<std::string> dump;
  add_dump_option(app, dump);
  add_footer(app);
  name_values(app);
  std::vector<std::string> reversed(flags.rbegin(), flags.rend());  // CLI11 takes its vector reversed
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    result.exit_code = 0;
    return result;
  } catch (const CLI::ParseError& e) {
    result.exit_code = refuse(e, err);
    return result;
  }
  if (const std::string problem = problem_with(app, options); !problem.empty()) {
    err << "ddprun: error: " << problem << "\nRun ddprun --help for usage.\n";
    result.exit_code = 2;
    return result;
  }
  result.options = options;
  return result;
}

}  // namespace launcher
}  // namespace ddp
