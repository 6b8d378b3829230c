// Command-line parsing (CLI11), mpirun command construction, output-tag rewriting and failure attribution.
#include "launcher/command.h"

#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/core/device.h"

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

// Physical cores, as Open MPI counts slots and binds: hyperthreads of one core count once.
int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const int cpus = CPU_COUNT(&set);
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core(base + "core_id"), package(base + "physical_package_id");
    std::string core_id, package_id;
    if (!(core >> core_id) || !(package >> package_id)) return std::max(1, cpus);  // no topology: count CPUs
    cores.insert({package_id, core_id});
  }
  return std::max(1, static_cast<int>(cores.size()));
}

}  // namespace

MachineFacts current_machine() {
  MachineFacts facts;
  facts.gpus = cuda_device_count();
  facts.cores = physical_cores();
  facts.root = ::geteuid() == 0;
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

int hostfile_slots(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("--hostfile " + path + ": cannot be read (does it exist?)");
  int total = 0;
  int hosts = 0;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::stringstream words(line);
    std::string host;
    if (!(words >> host)) continue;
    ++hosts;
    int slots = 1;
    for (std::string word; words >> word;) {
      if (starts_with(word, "slots=") && !parse_positive(word.substr(6), &slots)) {
        throw InvalidArgument("--hostfile " + path + ": '" + word + "' for host " + host +
                              " is not a positive slot count");
      }
    }
    total += slots;
  }
  if (hosts == 0) throw InvalidArgument("--hostfile " + path + " lists no host");
  return total;
}

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

  CLI::App app(
      "ddprun: starts a data-parallel training job, one rank per GPU (or CPU ranks), through mpirun.\n"
      "Usage: ddprun [-np N] [--hosts h1:4,h2:4 | --hostfile F] [--backend nccl|mpi] [--max-restarts K]\n"
      "              [--dry-run] -- PROGRAM ARGS...\n"
      "Each output line is prefixed with \"[rank R] \". DDP_* and NCCL_* variables are forwarded to every rank.\n"
      "The exit status is the job's; on failure ddprun names the rank that failed first.",
      "ddprun");
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
                 "resumes from its latest complete checkpoint)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--dry-run", options.dry_run, "print the mpirun command and exit");
  app.footer("Example: ddprun -np 2 -- bazel-bin/examples/train_mlp --epochs 1");

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
  if (app.count("--np") > 0 && options.np <= 0) {
    problem = "-np must be a positive number of ranks, got " + std::to_string(options.np);
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

  // Capacity: this node's physical cores, or the slots of the host list.
  const bool several_nodes = !options.hosts.empty() || !options.hostfile.empty();
  int capacity = std::max(1, facts.cores);
  if (!options.hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", options.hosts});
    capacity = resolve_np(LaunchOptions{0, options.hosts, "", "", 0, false, {}}, facts);
  } else if (!options.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", options.hostfile});
    capacity = hostfile_slots(options.hostfile);
  }
  if (np > capacity) {
    // More ranks than cores (or slots): pinning two ranks to one core would serialise them, so let them float.
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none", "--map-by", "slot"});
  } else if (several_nodes) {
    cmd.insert(cmd.end(), {"--map-by", "slot", "--bind-to", "core"});
  } else {
    // One node: give each rank an equal block of cores (its compute, BLAS and communication threads), so ranks
    // do not migrate or share cores. World binds rank r to GPU local_rank % gpus.
    const int per_rank = std::max(1, capacity / np);
    cmd.insert(cmd.end(), {"--map-by", "slot:PE=" + std::to_string(per_rank), "--bind-to", "core"});
  }
  cmd.push_back("--tag-output");

  std::map<std::string, std::string> set = extra_env;  // -x K=V
  if (!options.backend.empty()) set["DDP_BACKEND"] = options.backend;
  // NVLink SHARP (NVLS) multicast is off unless the user asks: it needs fabric support many hosts lack.
  if (facts.env.count("NCCL_NVLS_ENABLE") == 0 && set.count("NCCL_NVLS_ENABLE") == 0) set["NCCL_NVLS_ENABLE"] = "0";
  for (const auto& [name, value] : facts.env) {
    if ((starts_with(name, "DDP_") || starts_with(name, "NCCL_")) && set.count(name) == 0) {
      cmd.insert(cmd.end(), {"-x", name});
    }
  }
  for (const auto& [name, value] : set) cmd.insert(cmd.end(), {"-x", name + "=" + value});
  if (!rank_wrapper.empty()) cmd.insert(cmd.end(), {rank_wrapper, kRankWrapperFlag, "--"});
  cmd.insert(cmd.end(), options.program.begin(), options.program.end());
  return cmd;
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

std::string rewrite_tagged_line(const std::string& line) {
  const TaggedLine t = parse_tagged_line(line);
  return t.tagged ? "[rank " + std::to_string(t.rank) + "] " + t.text : line;
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

std::string exit_marker(int rank, int status, long long time_ns) {
  return "ddprun-exit: rank=" + std::to_string(rank) + " status=" + std::to_string(status) +
         " time_ns=" + std::to_string(time_ns);
}

bool parse_exit_marker(const std::string& raw_line, int* rank, int* status, long long* time_ns) {
  const std::string text = parse_tagged_line(raw_line).text;
  if (!starts_with(text, "ddprun-exit: rank=")) return false;
  long long r = 0, s = 0, t = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "ddprun-exit: rank=%lld status=%lld time_ns=%lld%c", &r, &s, &t, &tail) != 3 ||
      r < 0 || r > 1000000000 || s < 0 || s > 1000) {
    return false;
  }
  *rank = static_cast<int>(r);
  *status = static_cast<int>(s);
  *time_ns = t;
  return true;
}

void FailureTracker::observe(const std::string& raw_line) {
  int rank = 0, status = 0;
  long long time_ns = 0;
  if (parse_exit_marker(raw_line, &rank, &status, &time_ns)) {
    if (status != 0 && (!from_marker_ || time_ns < marker_time_)) {
      from_marker_ = rank;
      marker_status_ = status;
      marker_time_ = time_ns;
    }
    return;
  }
  const TaggedLine t = parse_tagged_line(raw_line);
  const std::string& text = t.text;
  if (!t.tagged && !from_mpirun_) {
    // "  Process name: [[3346,1],1]": the first process to exit non-zero.
    const size_t at = text.find("Process name: [[");
    if (at != std::string::npos) {
      const size_t close = text.find("],", at);
      if (close != std::string::npos) from_mpirun_ = number_after(text, text.substr(at, close - at + 2));
    }
    if (!from_mpirun_) from_mpirun_ = number_after(text, "mpirun noticed that process rank ");
    if (!from_mpirun_) from_mpirun_ = number_after(text, "MPI_ABORT was invoked on rank ");
  }
  if (!from_runtime_) {
    // The runtime's own report, "rank R: error: ..." or "rank R: fatal: ..." (anywhere in the line).
    for (size_t at = text.find("rank "); at != std::string::npos; at = text.find("rank ", at + 1)) {
      const std::optional<int> r = number_after(text.substr(at), "rank ");
      if (!r) continue;
      const size_t after = at + 5 + std::to_string(*r).size();
      if (text.compare(after, 9, ": error: ") == 0 || text.compare(after, 9, ": fatal: ") == 0) {
        from_runtime_ = r;
        break;
      }
    }
  }
}

std::optional<int> FailureTracker::first_failed_rank() const {
  if (from_marker_) return from_marker_;
  return from_mpirun_ ? from_mpirun_ : from_runtime_;
}

std::string FailureTracker::first_failure_how() const {
  if (!from_marker_) return "";
  return marker_status_ > 128 ? "signal " + std::to_string(marker_status_ - 128)
                              : "exit status " + std::to_string(marker_status_);
}

}  // namespace launcher
}  // namespace ddp
