// Host facts from sysfs, the probe line, and the mapping decision (see hosts.h).
#include "launcher/hosts.h"

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "launcher/gpus.h"
#include "launcher/relay.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

bool parse_positive(const std::string& text, int* out) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), ::isdigit)) return false;
  *out = std::stoi(text);
  return *out > 0;
}


std::string read_word(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  return word;
}

// The NUMA node of `cpu`: sysfs links cpuN/nodeK. -1 when the kernel has no NUMA information.
int numa_node_of_cpu(int cpu) {
  const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int node = -1;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.rfind("node", 0) == 0 && std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      node = std::stoi(name.substr(4));
      break;
    }
  }
  ::closedir(d);
  return node;
}

// NUMA nodes the kernel knows (memory-only ones included), from /sys/devices/system/node/nodeN.
int numa_node_count() {
  DIR* d = ::opendir("/sys/devices/system/node");
  if (d == nullptr) return 0;
  int count = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.rfind("node", 0) == 0 && std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      count = std::max(count, std::stoi(name.substr(4)) + 1);
    }
  }
  ::closedir(d);
  return count;
}

std::string join_ints(const std::vector<int>& values) {
  if (values.empty()) return "-";
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

bool parse_ints(const std::string& text, std::vector<int>* out) {
  out->clear();
  if (text == "-") return true;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const bool negative = !item.empty() && item[0] == '-';
    const std::string digits = negative ? item.substr(1) : item;
    if (digits.empty() || digits.size() > 6 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return false;
    out->push_back(negative ? -std::stoi(digits) : std::stoi(digits));
  }
  return !out->empty();
}

// k when every NUMA node of `facts` has cores and exactly k of the host's GPUs, the GPUs in NUMA order (so
// that ranks placed k per NUMA node, in order, land on their GPU's node); 0 otherwise.
int gpus_per_numa_node(const HostFacts& facts) {
  const int nodes = static_cast<int>(facts.numa_cores.size());
  const int gpus = facts.gpus();
  if (nodes == 0 || gpus == 0 || gpus % nodes != 0) return 0;
  const int k = gpus / nodes;
  for (int j = 0; j < gpus; ++j) {
    if (facts.gpu_numa[j] != j / k) return 0;
  }
  for (int cores : facts.numa_cores) {
    if (cores < k) return 0;
  }
  return k;
}

}  // namespace

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
      if (word.starts_with("slots=") && !parse_positive(word.substr(6), &h.slots)) {
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

HostFacts host_facts_here() {
  HostFacts facts;
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool have_affinity = ::sched_getaffinity(0, sizeof set, &set) == 0;
  // Physical cores, as Open MPI counts and binds them: hyperthreads of one core count once.
  std::set<std::pair<std::string, std::string>> cores;
  std::map<int, std::set<std::pair<std::string, std::string>>> cores_of_node;
  bool topology = have_affinity;
  for (int cpu = 0; topology && cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::string core = read_word(base + "core_id"), package = read_word(base + "physical_package_id");
    if (core.empty() || package.empty()) {
      topology = false;
      break;
    }
    cores.insert({package, core});
    const int node = numa_node_of_cpu(cpu);
    if (node >= 0) cores_of_node[node].insert({package, core});
  }
  if (topology) {
    facts.cores = std::max(1, static_cast<int>(cores.size()));
    const int nodes = numa_node_count();
    if (nodes > 0) {
      facts.numa_cores.assign(static_cast<size_t>(nodes), 0);
      for (const auto& [node, node_cores] : cores_of_node) {
        if (node < nodes) facts.numa_cores[static_cast<size_t>(node)] = static_cast<int>(node_cores.size());
      }
    }
  } else {
    // No topology: count CPUs.
    const int cpus = have_affinity ? CPU_COUNT(&set) : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    facts.cores = std::max(1, cpus);
  }
  for (const std::string& address : local_gpu_addresses()) {
    const std::string node = address.empty() ? "" : read_word("/sys/bus/pci/devices/" + address + "/numa_node");
    int value = -1;
    if (!node.empty() && node.size() < 6 && std::all_of(node.begin(), node.end(), ::isdigit)) value = std::stoi(node);
    facts.gpu_numa.push_back(value);
  }
  return facts;
}

std::string probe_line(const HostFacts& facts) {
  return "ddprun-probe: cores=" + std::to_string(facts.cores) + " numa_cores=" + join_ints(facts.numa_cores) +
         " gpu_numa=" + join_ints(facts.gpu_numa);
}

std::optional<HostFacts> parse_probe_line(const std::string& raw_line) {
  std::stringstream in(parse_tagged_line(raw_line).text);
  std::string head, cores, numa, gpus, extra;
  if (!(in >> head >> cores >> numa >> gpus) || (in >> extra) || head != "ddprun-probe:" ||
      cores.rfind("cores=", 0) != 0 || numa.rfind("numa_cores=", 0) != 0 || gpus.rfind("gpu_numa=", 0) != 0) {
    return std::nullopt;
  }
  HostFacts facts;
  std::vector<int> count;
  if (!parse_ints(cores.substr(6), &count) || count.size() != 1 || count[0] < 1) return std::nullopt;
  facts.cores = count[0];
  if (!parse_ints(numa.substr(11), &facts.numa_cores) || !parse_ints(gpus.substr(9), &facts.gpu_numa)) {
    return std::nullopt;
  }
  return facts;
}

std::vector<std::string> binding_arguments(int np, const std::vector<PlacedHost>& hosts) {
  const std::vector<std::string> unbound = {"--oversubscribe", "--bind-to", "none", "--map-by", "slot"};
  // Ranks per host, as mpirun fills them.
  std::vector<std::pair<const PlacedHost*, int>> used;
  int left = np;
  for (const PlacedHost& h : hosts) {
    const int here = std::min(left, h.slots.slots);
    if (here > 0) used.emplace_back(&h, here);
    left -= here;
  }
  if (left > 0 || used.empty()) return unbound;  // more ranks than slots
  int per_rank = 1 << 30;
  int per_numa = -1;  // k of gpus_per_numa_node, the same on every host; 0: no NUMA mapping
  int numa_per_rank = 1 << 30;
  for (const auto& [host, ranks] : used) {
    if (ranks > host->facts.cores) return unbound;  // pinning two ranks to a core would serialise them
    per_rank = std::min(per_rank, host->facts.cores / ranks);
    const int k = ranks == host->facts.gpus() ? gpus_per_numa_node(host->facts) : 0;
    per_numa = per_numa < 0 || per_numa == k ? k : 0;
    for (int cores : host->facts.numa_cores) numa_per_rank = std::min(numa_per_rank, k > 0 ? cores / k : 0);
  }
  if (per_numa > 0 && numa_per_rank >= 1) {
    return {"--map-by", "ppr:" + std::to_string(per_numa) + ":numa:PE=" + std::to_string(numa_per_rank), "--bind-to",
            "core"};
  }
  return {"--map-by", "slot:PE=" + std::to_string(per_rank), "--bind-to", "core"};
}

}  // namespace launcher
}  // namespace ddp
