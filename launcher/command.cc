// Command-line parsing (CLI11), mpirun command construction, resource warnings, output-tag rewriting and
// failure attribution.
#include "launcher/command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/core/stop_request.h"

extern char** environ;

namespace ddp {
namespace launcher {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

bool parse_positive(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), ::isdigit)) return false;
  *out = std::stoi(text);
  return *out > 0;
}

// MemAvailable (what can be allocated without swapping out the page cache's working set), in bytes; 0 when
// /proc/meminfo cannot be read. Falls back to free physical pages on kernels without MemAvailable.
long long available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string name; meminfo >> name;) {
    long long kib = 0;
    if (name == "MemAvailable:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(1 << 20, '\n');
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<long long>(pages) * page : 0;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

MachineFacts current_machine() {
  MachineFacts facts;
  const HostFacts here = host_facts_here();
  facts.gpus = here.gpus();
  facts.cores = here.cores;
  facts.numa_cores = here.numa_cores;
  facts.gpu_numa = here.gpu_numa;
  facts.root = ::geteuid() == 0;
  facts.memory_available_bytes = available_memory_bytes();
#if defined(__x86_64__)
  facts.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) facts.env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return facts;
}

std::vector<HostSlots> parse_hosts(const std::string& spec) {
  std::vector<HostSlots> hosts;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    HostSlots h;
    const size_t colon = item.rfind(':');
    h.host = item.substr(0, colon);
    if (colon != std::string::npos && !parse_positive(item.substr(colon + 1), &h.slots)) {
      throw InvalidArgument("--hosts entry '" + item + "': the slot count after ':' must be a positive integer");
    }
    if (h.host.empty() || h.host.find_first_of(" \t") != std::string::npos) {
      throw InvalidArgument("--hosts entry '" + item + "' has no host name; write --hosts h1:4,h2:4");
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw InvalidArgument("--hosts is empty; write --hosts h1:4,h2:4");
  return hosts;
}

std::vector<HostSlots> parse_hostfile(const std::string& path) {
  // Only a regular file is opened: a FIFO given as the host file would block the open for ever.
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    throw InvalidArgument("--hostfile " + path + " is not a regular file (a FIFO, a directory or a device); give " +
                          "the path of a file that lists the hosts");
  }
  std::ifstream in(path);
  if (!in) throw InvalidArgument("--hostfile " + path + ": cannot be read (does it exist?)");
  std::vector<HostSlots> hosts;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::stringstream words(line);
    HostSlots h;
    if (!(words >> h.host)) continue;
    for (std::string word; words >> word;) {
      if (starts_with(word, "slots=") && !parse_positive(word.substr(6), &h.slots)) {
        throw InvalidArgument("--hostfile " + path + ": '" + word + "' for host " + h.host +
                              " is not a positive slot count");
      }
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw InvalidArgument("--hostfile " + path + " lists no host");
  return hosts;
}

int hostfile_slots(const std::string& path) {
  int total = 0;
  for (const HostSlots& h : parse_hostfile(path)) total += h.slots;
  return total;
}

std::vector<HostSlots> job_hosts(const LaunchOptions& options) {
  if (!options.hosts.empty()) return parse_hosts(options.hosts);
  if (!options.hostfile.empty()) return parse_hostfile(options.hostfile);
  return {};
}

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

}  // namespace

namespace {

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

}  // namespace

ParsedCommandLine parse_command_line(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  ParsedCommandLine result;
  LaunchOptions options;
  std::vector<std::string> flags;
  bool separator = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    if (!separator && argv[i] == "--") {
      separator = true;
    } else if (separator) {
      options.program.push_back(argv[i]);
    } else {
      // mpirun spells it -np; CLI11 allows only one letter after a single dash.
      flags.push_back(argv[i] == "-np" ? "--np" : starts_with(argv[i], "-np=") ? "--np=" + argv[i].substr(4) : argv[i]);
    }
  }

  CLI::App app("ddprun: starts a data-parallel training job, one rank per GPU (or CPU ranks), through mpirun.",
               "ddprun");
  app.formatter(std::make_shared<DdprunHelp>());
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
  // Taken before the rest (ddprun.cc): listed here so that --help shows it, refused among other flags.
  std::vector<std::string> dump;
  app.add_option("--dump", dump,
                 "alone: every rank of the running job of ddprun PID (or of the one job of yours) prints its flight "
                 "recorder, its last collectives and its phase, and the job goes on (also: SIGUSR2 to ddprun)")
      ->option_text("[PID]")
      ->expected(0, 1);
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

  // Each value said in words with its default, instead of CLI11's type strings ("INT:NONNEGATIVE=400").
  for (const auto& [name, value] : std::vector<std::pair<const char*, std::string>>{
           {"--np", "N"}, {"--hosts", "HOST:SLOTS,... (or --hostfile)"}, {"--hostfile", "FILE (or --hosts)"},
           {"--backend", "nccl|mpi"}, {"--max-restarts", "K (default 0)"}, {"--min-np", "N"},
           {"--rank-memory-mib", "MIB (default " + std::to_string(kDefaultRankMemoryMib) + ")"},
           {"--stop-grace", "SECONDS (default " + std::to_string(kDefaultStopGraceS) + ")"}}) {
    app.get_option(name)->option_text(value);
  }
  std::vector<std::string> reversed(flags.rbegin(), flags.rend());  // CLI11 takes its vector reversed
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    result.exit_code = 0;
    return result;
  } catch (const CLI::ParseError& e) {
    err << "ddprun: error: " << e.what() << "\n";
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      err << "ddprun: put the program and its arguments after --: ddprun [options] -- PROGRAM ARGS...\n";
    }
    err << "Run ddprun --help for usage.\n";
    result.exit_code = 2;
    return result;
  }
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
  if (!problem.empty()) {
    err << "ddprun: error: " << problem << "\nRun ddprun --help for usage.\n";
    result.exit_code = 2;
    return result;
  }
  result.options = options;
  return result;
}

long long open_files_needed(int ranks_here) { return 32 + 6LL * std::max(ranks_here, 0); }

std::string open_files_refusal(int ranks_here, long long limit) {
  const long long needed = open_files_needed(ranks_here);
  if (limit >= needed) return "";
  return "the open files limit (ulimit -n) is " + std::to_string(limit) + ", too few for mpirun to start " +
         std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s") + " here (it needs about " +
         std::to_string(needed) + "; it would wait forever): raise it, e.g. ulimit -n " +
         std::to_string(std::max(1024LL, needed)) + ", or ask for a higher hard limit";
}

int resolve_np(const LaunchOptions& options, const MachineFacts& facts) {
  if (options.np > 0) return options.np;
  if (!options.hosts.empty()) {
    int total = 0;
    for (const HostSlots& h : parse_hosts(options.hosts)) total += h.slots;
    return total;
  }
  if (!options.hostfile.empty()) return hostfile_slots(options.hostfile);
  return facts.gpus > 0 ? facts.gpus : 2;
}

std::vector<std::string> resource_warnings(const LaunchOptions& options, const MachineFacts& facts) {
  std::vector<std::string> warnings;
  if (!options.hosts.empty() || !options.hostfile.empty()) return warnings;
  const int np = resolve_np(options, facts);
  const int cores = std::max(1, facts.cores);
  if (np > kMaxRanksPerCore * cores) {
    warnings.push_back(std::to_string(np) + " ranks on " + std::to_string(cores) + " core" + (cores == 1 ? "" : "s") +
                       " of this node (more than " + std::to_string(kMaxRanksPerCore) +
                       " per core): each rank waits for a core most of the time, so the job runs slower than "
                       "with fewer ranks and its collectives may exceed DDP_COLLECTIVE_TIMEOUT_S; use -np " +
                       std::to_string(kMaxRanksPerCore * cores) + " or fewer, or spread the job over nodes (--hosts)");
  }
  const double rank_bytes = static_cast<double>(options.rank_memory_mib) * 1024 * 1024;
  if (rank_bytes > 0 && facts.memory_available_bytes > 0 &&
      np * rank_bytes > static_cast<double>(facts.memory_available_bytes)) {
    const long long fit = static_cast<long long>(static_cast<double>(facts.memory_available_bytes) / rank_bytes);
    warnings.push_back(std::to_string(np) + " ranks of about " + std::to_string(options.rank_memory_mib) +
                       " MiB each (--rank-memory-mib) need " + gib(np * rank_bytes) + ", more than the " +
                       gib(static_cast<double>(facts.memory_available_bytes)) +
                       " of memory available on this node: the kernel will kill ranks when memory runs out (the "
                       "job then fails with \"signal 9\"); use -np " + std::to_string(std::max(1LL, fit)) +
                       " or fewer, or give --rank-memory-mib your program's real peak (VmHWM in /proc/PID/status)");
  }
  return warnings;
}

std::vector<std::string> build_mpirun_command(const LaunchOptions& options, const MachineFacts& facts,
                                              const std::map<std::string, std::string>& extra_env,
                                              const std::string& rank_wrapper) {
  if (options.program.empty()) throw InvalidArgument("ddprun: no program to run");
  if (!options.hosts.empty() && !options.hostfile.empty()) {
    throw InvalidArgument("ddprun: --hosts and --hostfile exclude each other; give one");
  }
  if (options.np < 0) throw InvalidArgument("ddprun: -np must be positive, got " + std::to_string(options.np));
  const int np = resolve_np(options, facts);
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np)};
  if (facts.root) cmd.push_back("--allow-run-as-root");

  if (!options.hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", options.hosts});
  } else if (!options.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", options.hostfile});
  }
  // Each rank an equal block of its host's cores (its compute, BLAS and communication threads), on its GPU's
  // NUMA node where the hosts allow, so ranks neither migrate nor share cores (hosts.h). World binds rank r to
  // GPU local_rank % gpus. Hosts not probed are taken to be like this one.
  HostFacts here;
  here.cores = std::max(1, facts.cores);
  here.numa_cores = facts.numa_cores;
  here.gpu_numa = facts.gpu_numa;
  if (here.gpus() != facts.gpus) here.gpu_numa.assign(static_cast<size_t>(std::max(0, facts.gpus)), -1);
  std::vector<PlacedHost> placed;
  const std::vector<HostSlots> hosts = job_hosts(options);
  if (hosts.empty()) placed.push_back(PlacedHost{HostSlots{"", np}, here});
  for (size_t i = 0; i < hosts.size(); ++i) {
    placed.push_back(PlacedHost{hosts[i], i < facts.hosts.size() ? facts.hosts[i] : here});
  }
  const std::vector<std::string> binding = binding_arguments(np, placed);
  cmd.insert(cmd.end(), binding.begin(), binding.end());
  cmd.push_back("--tag-output");
  // A job on this node alone takes Open MPI's shared-memory path (pml ob1) by name: left to choose, MPI_Init
  // first opens and probes the interconnect libraries a job that never leaves the node has no use for (PSM,
  // PSM2, OFI), a quarter of a second or more of every start. Jobs over several hosts keep Open MPI's choice,
  // and a user's own OMPI_MCA_pml wins.
  if (hosts.empty() && facts.env.count("OMPI_MCA_pml") == 0) cmd.insert(cmd.end(), {"--mca", "pml", "ob1"});
  // Inside a Slurm job, a time limit or scancel signals every process of the job at once, mpirun too, which
  // would end its ranks 1 s later (odls_base_sigkill_timeout) in the middle of the stop the same signal asked
  // them for. mpirun sends its SIGTERM after that timeout and its SIGKILL, and exits, about as long again
  // later: half the stop grace each keeps its end inside the grace (and inside Slurm's KillWait, when the
  // grace is). The price: a failed job under Slurm takes about the grace to be torn down (docs/slurm.md).
  if (facts.env.count("SLURM_JOB_ID") > 0) {
    cmd.insert(cmd.end(), {"--mca", "odls_base_sigkill_timeout", std::to_string(std::max(1, options.stop_grace_s / 2))});
  }
  std::map<std::string, std::string> set = extra_env;  // -x K=V
  if (!options.backend.empty()) set[std::string(settings::setting("DDP_BACKEND").name)] = options.backend;
  // NVLink SHARP (NVLS) multicast is off unless the user asks: it needs fabric support many hosts lack.
  if (facts.env.count("NCCL_NVLS_ENABLE") == 0 && set.count("NCCL_NVLS_ENABLE") == 0) set["NCCL_NVLS_ENABLE"] = "0";
  // One OpenBLAS kernel on every machine (kOpenBlasCoreType); a user's own choice is forwarded as it is.
  if (facts.avx2_fma && facts.env.count("OPENBLAS_CORETYPE") == 0 && set.count("OPENBLAS_CORETYPE") == 0) {
    set["OPENBLAS_CORETYPE"] = kOpenBlasCoreType;
  }
  for (const auto& [name, value] : facts.env) {
    if ((starts_with(name, "DDP_") || starts_with(name, "NCCL_") || name == "OPENBLAS_CORETYPE") &&
        set.count(name) == 0) {
      cmd.insert(cmd.end(), {"-x", name});
    }
  }
  for (const auto& [name, value] : set) cmd.insert(cmd.end(), {"-x", name + "=" + value});
  if (!rank_wrapper.empty()) cmd.insert(cmd.end(), {rank_wrapper, kRankWrapperFlag, "--"});
  cmd.insert(cmd.end(), options.program.begin(), options.program.end());
  return cmd;
}

std::vector<std::string> build_probe_command(const std::string& host, const MachineFacts& facts,
                                             const std::string& probe, const std::string& session_base) {
  std::vector<std::string> cmd = {"mpirun", "-np", "1"};
  if (facts.root) cmd.push_back("--allow-run-as-root");
  if (!session_base.empty()) cmd.insert(cmd.end(), {"--mca", "orte_local_tmpdir_base", session_base});
  // Unbound, so that the probe sees every core the host gives the job.
  cmd.insert(cmd.end(), {"--host", host, "--bind-to", "none", probe, kProbeFlag});
  return cmd;
}

AttemptPlan plan_attempt(const LaunchOptions& options, const MachineFacts& facts,
                         const std::vector<HostAnswer>& answers) {
  const std::vector<HostSlots> hosts = job_hosts(options);
  DDP_CHECK(answers.size() == hosts.size(), "plan_attempt: " + std::to_string(answers.size()) + " answers for " +
                                                std::to_string(hosts.size()) + " hosts");
  AttemptPlan plan;
  plan.options = options;
  std::string kept;
  int kept_slots = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (answers[i].reachable) {
      plan.facts.push_back(answers[i].facts);
      kept += (kept.empty() ? "" : ",") + hosts[i].host + ":" + std::to_string(hosts[i].slots);
      kept_slots += hosts[i].slots;
    } else {
      plan.lost.push_back(hosts[i].host + " (" + answers[i].error + ")");
    }
  }
  if (plan.lost.empty()) return plan;
  std::string lost;
  for (const std::string& l : plan.lost) lost += (lost.empty() ? "" : ", ") + l;
  const int np = std::min(resolve_np(options, facts), kept_slots);
  if (options.min_np == 0) {
    plan.refusal = "cannot reach " + lost + "; pass --min-np N to go on with the hosts that answer when N ranks fit";
  } else if (np < options.min_np) {
    plan.refusal = "cannot reach " + lost + ", and the hosts that answer have slots for " + std::to_string(np) +
                   " rank" + (np == 1 ? "" : "s") + ", fewer than --min-np " + std::to_string(options.min_np);
  } else {
    plan.options.hosts = kept;
    plan.options.hostfile.clear();
    plan.options.np = np;
  }
  return plan;
}

std::string shell_quote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                              "_-+=/.,:@%") == std::string::npos) {
    return word;
  }
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& w : words) line += (line.empty() ? "" : " ") + shell_quote(w);
  return line;
}

TaggedLine parse_tagged_line(const std::string& line) {
  TaggedLine t;
  t.text = line;
  // "[J,R]<stream>:text"
  if (line.size() < 6 || line[0] != '[') return t;
  const size_t comma = line.find(',');
  const size_t close = line.find(']');
  if (comma == std::string::npos || close == std::string::npos || comma > close || close + 1 >= line.size() ||
      line[close + 1] != '<') {
    return t;
  }
  const std::string job = line.substr(1, comma - 1);
  const std::string rank = line.substr(comma + 1, close - comma - 1);
  const size_t end = line.find(">:", close);
  int rank_value = 0;
  if (job.empty() || !std::all_of(job.begin(), job.end(), ::isdigit) || end == std::string::npos ||
      rank.empty() || rank.size() > 9 || !std::all_of(rank.begin(), rank.end(), ::isdigit)) {
    return t;
  }
  rank_value = std::stoi(rank);
  t.tagged = true;
  t.rank = rank_value;
  t.stream = line.substr(close + 2, end - close - 2);
  t.text = line.substr(end + 2);
  return t;
}

namespace {

// The length of the tag "[J,R]<stream>:" at `at` of `text`; 0 when there is none there; -1 when `text` ends
// before it could be told (a tag may be cut across two reads).
long tag_length_at(const std::string& text, size_t at) {
  size_t i = at;
  auto more = [&] { return i < text.size(); };
  if (!more()) return -1;
  if (text[i++] != '[') return 0;
  for (int part = 0; part < 2; ++part) {
    const size_t digits = i;
    while (more() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (!more()) return -1;
    if (i == digits || i - digits > 9 || text[i++] != (part == 0 ? ',' : ']')) return 0;
  }
  if (!more()) return -1;
  if (text[i++] != '<') return 0;
  const size_t name = i;
  while (more() && std::islower(static_cast<unsigned char>(text[i]))) ++i;
  if (!more()) return -1;
  if (i == name || i - name > 8 || text[i++] != '>') return 0;
  if (!more()) return -1;
  if (text[i++] != ':') return 0;
  return static_cast<long>(i - at);
}

}  // namespace

std::vector<std::string> TaggedLineJoiner::feed(const std::string& bytes) {
  pending_ += bytes;
  std::vector<std::string> lines;
  auto line_of = [&](const std::string& tag) -> std::string& {
    for (auto& [t, line] : partial_) {
      if (t == tag) return line;
    }
    partial_.emplace_back(tag, "");
    return partial_.back().second;
  };
  auto emit_tagged = [&](const std::string& tag) {
    for (auto it = partial_.begin(); it != partial_.end(); ++it) {
      if (it->first != tag) continue;
      lines.push_back(tag + it->second);
      partial_.erase(it);
      return;
    }
  };
  size_t i = 0;
  while (i < pending_.size()) {
    if (pending_[i] == '[') {
      const long tag = tag_length_at(pending_, i);
      if (tag < 0) break;  // perhaps a tag cut in two: wait for the rest
      if (tag > 0) {
        if (!untagged_.empty()) {  // mpirun's own text cut by a rank's piece: a line of its own
          lines.push_back(untagged_);
          untagged_.clear();
        }
        current_tag_ = pending_.substr(i, static_cast<size_t>(tag));
        line_of(current_tag_);
        i += static_cast<size_t>(tag);
        continue;
      }
    }
    // Up to the next newline, carriage return or '[' (which may start a tag), whichever comes first.
    size_t end = pending_.find_first_of("\n\r[", i + 1);
    if (pending_[i] == '\n' || pending_[i] == '\r') end = i;
    if (end == std::string::npos) end = pending_.size();
    // A carriage return ends a rank's redraw, unless a newline follows it ("\r\n"); one at the very end of the
    // bytes so far waits for the next byte to tell.
    if (end < pending_.size() && pending_[end] == '\r' && !current_tag_.empty()) {
      if (end + 1 == pending_.size()) {
        line_of(current_tag_) += pending_.substr(i, end - i);
        i = end;
        break;
      }
      if (pending_[end + 1] != '\n') {
        line_of(current_tag_) += pending_.substr(i, end - i) + "\r";
        emit_tagged(current_tag_);  // the piece runs on under the same tag (the next redraw, or the line)
        i = end + 1;
        continue;
      }
      line_of(current_tag_) += pending_.substr(i, end - i);
      i = end + 1;  // the newline ends the line below
      continue;
    }
    if (end < pending_.size() && pending_[end] == '\r') {  // in mpirun's own text: text, up to the next stop
      end = pending_.find_first_of("\n[", end + 1);
      if (end == std::string::npos) end = pending_.size();
    }
    const bool newline = end < pending_.size() && pending_[end] == '\n';
    const std::string piece = pending_.substr(i, end - i);
    if (!current_tag_.empty()) {
      line_of(current_tag_) += piece;
      if (newline) {
        emit_tagged(current_tag_);
        current_tag_.clear();
      }
    } else {
      untagged_ += piece;
      if (newline) {
        lines.push_back(untagged_);
        untagged_.clear();
      }
    }
    i = newline ? end + 1 : end;
  }
  pending_.erase(0, i);
  return lines;
}

std::vector<std::string> TaggedLineJoiner::finish() {
  std::vector<std::string> lines = feed("");
  if (!pending_.empty()) {
    // A cut tag at the very end: text, then.
    if (!current_tag_.empty()) {
      for (auto& [tag, line] : partial_) {
        if (tag == current_tag_) line += pending_;
      }
    } else {
      untagged_ += pending_;
    }
    pending_.clear();
  }
  if (!untagged_.empty()) lines.push_back(untagged_);
  untagged_.clear();
  for (const auto& [tag, line] : partial_) {
    if (!line.empty()) lines.push_back(tag + line);
  }
  partial_.clear();
  current_tag_.clear();
  return lines;
}

std::string rewrite_tagged_line(const std::string& line) {
  const TaggedLine t = parse_tagged_line(line);
  if (!t.tagged) return line;
  // The runtime's own "rank R: error: ..." (for plain mpirun) says the rank the prefix already says.
  const std::string own = "rank " + std::to_string(t.rank) + ": ";
  const bool says_rank = t.text.rfind(own, 0) == 0;
  return "[rank " + std::to_string(t.rank) + "] " + (says_rank ? t.text.substr(own.size()) : t.text);
}

namespace {

bool is_dash_line(const std::string& line) {
  return line.size() >= 20 && line.find_first_not_of('-') == std::string::npos;
}

// A banner of mpirun's about the job's end, which ddprun says in its own words.
bool is_end_banner(const std::vector<std::string>& block) {
  static const char* const kPhrases[] = {
      "MPI_ABORT was invoked on rank",
      "Primary job  terminated normally",
      "Primary job terminated normally",
      "mpirun detected that one or more processes exited with non-zero status",
      "mpirun noticed that process rank",
      "exiting improperly",
  };
  for (const std::string& line : block) {
    for (const char* phrase : kPhrases) {
      if (line.find(phrase) != std::string::npos) return true;
    }
  }
  return false;
}

// mpirun's loose lines about the same end.
bool is_end_noise(const std::string& line) {
  return line.find("ORTE_ERROR_LOG") != std::string::npos ||
         (line.find("more process") != std::string::npos && line.find("sent help message") != std::string::npos) ||
         line.find("orte_base_help_aggregate") != std::string::npos;
}

}  // namespace

std::vector<std::string> MpirunBannerFilter::feed(const std::string& line) {
  std::vector<std::string> out;
  if (!in_block_) {
    if (is_dash_line(line)) {
      in_block_ = true;
      block_ = {line};
    } else if (!is_end_noise(line)) {
      out.push_back(line);
    }
    return out;
  }
  block_.push_back(line);
  if (!is_dash_line(line)) return out;
  in_block_ = false;
  if (!is_end_banner(block_)) out = std::move(block_);
  block_.clear();
  return out;
}

std::vector<std::string> MpirunBannerFilter::finish() {
  std::vector<std::string> out = std::move(block_);
  block_.clear();
  in_block_ = false;
  return out;
}

namespace {

// The integer right after `marker` in `text`, if any.
std::optional<int> number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + marker.size();
  size_t j = i;
  while (j < text.size() && j - i < 9 && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  if (j == i) return std::nullopt;
  return std::stoi(text.substr(i, j - i));
}

}  // namespace

std::string exit_marker(const ExitMarker& m) {
  return "ddprun-exit: rank=" + std::to_string(m.rank) + " status=" + std::to_string(m.status) +
         " time_ns=" + std::to_string(m.time_ns) + " stopped=" + (m.stopped ? "1" : "0") +
         " asked=" + (m.asked_to_stop ? "1" : "0");
}

std::optional<ExitMarker> parse_exit_marker(const std::string& raw_line) {
  const std::string text = parse_tagged_line(raw_line).text;
  if (!starts_with(text, "ddprun-exit: rank=")) return std::nullopt;
  long long r = 0, s = 0, t = 0;
  int stopped = 0;
  int asked = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "ddprun-exit: rank=%lld status=%lld time_ns=%lld stopped=%d asked=%d%c", &r, &s,
                  &t, &stopped, &asked, &tail) != 5 ||
      r < 0 || r > 1000000000 || s < 0 || s > 1000 || (stopped != 0 && stopped != 1) || (asked != 0 && asked != 1)) {
    return std::nullopt;
  }
  ExitMarker m;
  m.rank = static_cast<int>(r);
  m.status = static_cast<int>(s);
  m.time_ns = t;
  m.stopped = stopped == 1;
  m.asked_to_stop = asked == 1;
  return m;
}

void FailureTracker::observe(const std::string& raw_line, long long arrival_ns) {
  if (const std::optional<ExitMarker> m = parse_exit_marker(raw_line)) {
    if (m->status == kStoppedExitStatus) ranks_stopped_as_asked_.insert(m->rank);
    if (m->asked_to_stop) ranks_asked_to_stop_.insert(m->rank);
    if (m->status == 0 || m->stopped || m->asked_to_stop) return;
    std::optional<Evidence>& kind = m->status > 128 ? crash_ : exit_;
    if (!kind || m->time_ns < kind->time_ns) kind = Evidence{m->rank, m->time_ns};
    status_of_.emplace(m->rank, m->status);
    return;
  }
  const TaggedLine t = parse_tagged_line(raw_line);
  const size_t daemon = t.tagged ? std::string::npos : t.text.find("Remote daemon: [[");
  const size_t node = daemon == std::string::npos ? daemon : t.text.find(" on node ", daemon);
  if (node != std::string::npos && lost_host_.empty()) {
    std::stringstream rest(t.text.substr(node + 9));
    rest >> lost_host_;
  }
  // ssh's own word for the same loss, which mpirun's report does not always follow (it depends on when the
  // daemon's connection breaks): "Connection to node3 closed by remote host."
  const size_t ssh_lost = t.tagged ? std::string::npos : t.text.find("Connection to ");
  if (ssh_lost != std::string::npos && t.text.find(" closed by remote host", ssh_lost) != std::string::npos &&
      lost_host_.empty()) {
    std::stringstream rest(t.text.substr(ssh_lost + 14));
    rest >> lost_host_;
  }
  if (!t.tagged && !from_mpirun_) {
    const std::string& text = t.text;
    // "  Process name: [[3346,1],1]": the first process to exit non-zero.
    const size_t at = text.find("Process name: [[");
    if (at != std::string::npos) {
      const size_t close = text.find("],", at);
      if (close != std::string::npos) from_mpirun_ = number_after(text, text.substr(at, close - at + 2));
    }
    if (!from_mpirun_) from_mpirun_ = number_after(text, "mpirun noticed that process rank ");
    if (!from_mpirun_) from_mpirun_ = number_after(text, "MPI_ABORT was invoked on rank ");
  }
  if (!report_) observe_report(t, arrival_ns);
}

void FailureTracker::observe_report(const TaggedLine& t, long long arrival_ns) {
  const std::string& text = t.text;
  // The lines after "error: WHAT:" list the ranks that raised it: "  rank 2: ..." or "  ranks 0,3: ...".
  if (agreed_error_printer_ && t.tagged && t.rank == *agreed_error_printer_) {
    std::optional<int> listed;
    if (starts_with(text, "  rank ")) listed = number_after(text, "  rank ");
    if (starts_with(text, "  ranks ")) listed = number_after(text, "  ranks ");
    report_ = Evidence{listed.value_or(t.rank), arrival_ns};  // no list after all: the printer is all we know
    return;
  }
  if (starts_with(text, "error: ") && text.back() == ':') {
    agreed_error_printer_ = t.tagged ? t.rank : 0;
    if (!t.tagged) report_ = Evidence{0, arrival_ns};
    return;
  }
  // "rank R: error: ..." or "rank R: fatal: ..." (anywhere in the line).
  for (size_t at = text.find("rank "); at != std::string::npos; at = text.find("rank ", at + 1)) {
    const std::optional<int> r = number_after(text.substr(at), "rank ");
    if (!r) continue;
    const size_t after = at + 5 + std::to_string(*r).size();
    if (text.compare(after, 9, ": error: ") == 0 || text.compare(after, 9, ": fatal: ") == 0) {
      report_ = Evidence{t.tagged ? t.rank : *r, arrival_ns};
      return;
    }
  }
}

std::optional<int> FailureTracker::first_failed_rank() const {
  // The earliest marker: crashes and exits alike, each at the time the wrapper saw it.
  std::optional<Evidence> marker = crash_;
  bool marker_is_crash = crash_.has_value();
  if (exit_ && (!marker || exit_->time_ns < marker->time_ns)) {
    marker = exit_;
    marker_is_crash = false;
  }
  if (marker && report_) {
    const long long slack = marker_is_crash ? 0 : kRelaySlackNs;
    return marker->time_ns + slack <= report_->time_ns ? marker->rank : report_->rank;
  }
  if (marker) return marker->rank;
  if (report_) return report_->rank;
  return from_mpirun_;
}

std::string FailureTracker::first_failure_how() const {
  const std::optional<int> rank = first_failed_rank();
  if (!rank || status_of_.count(*rank) == 0) return "";
  const int status = status_of_.at(*rank);
  return status > 128 ? "signal " + std::to_string(status - 128) : "exit status " + std::to_string(status);
}

}  // namespace launcher
}  // namespace ddp
