// Parsing Slurm's allocation variables and planning a ddprun job inside an allocation.
#include "launcher/slurm.h"

#include <algorithm>
#include <cctype>

#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// Splits at the commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& list, const std::string& what) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) throw InvalidArgument(what + " '" + list + "': unbalanced brackets");
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw InvalidArgument(what + " '" + list + "': unbalanced brackets");
  items.push_back(item);
  return items;
}

// What a list that expands past `max_hosts` names: the start of it, and the bound.
[[noreturn]] void refuse_too_many_hosts(const std::string& list, size_t max_hosts) {
  const std::string shown = list.size() > 80 ? list.substr(0, 80) + "..." : list;
  throw InvalidArgument("SLURM_JOB_NODELIST '" + shown + "' names more than " + std::to_string(max_hosts) +
                        " node(s), more than the allocation has tasks for (SLURM_TASKS_PER_NODE): these are not one "
                        "allocation's variables; start ddprun from the job's batch script or salloc's shell");
}

// One name with bracket groups, the first group expanded and the rest recursively: "n[1-2]x[3,4]". Stops at
// `max_hosts` names: a range such as node[1-99999999] would otherwise take minutes and gigabytes.
void expand_name(const std::string& name, const std::string& list, size_t max_hosts, std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (out->size() >= max_hosts) refuse_too_many_hosts(list, max_hosts);
    out->push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  const std::string prefix = name.substr(0, open);
  const std::string rest = name.substr(close + 1);
  const std::string ranges = name.substr(open + 1, close - open - 1);
  size_t start = 0;
  while (start <= ranges.size()) {
    const size_t comma = std::min(ranges.find(',', start), ranges.size());
    const std::string range = ranges.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || std::stol(hi) < std::stol(lo)) {
      throw InvalidArgument("SLURM_JOB_NODELIST '" + list + "': '" + range + "' is not a range like 1-4 or 07");
    }
    for (long i = std::stol(lo); i <= std::stol(hi); ++i) {
      std::string number = std::to_string(i);
      if (number.size() < lo.size()) number.insert(0, lo.size() - number.size(), '0');  // n[01-10]: n01 ... n10
      expand_name(prefix + number + rest, list, max_hosts, out);
    }
    start = comma + 1;
  }
}

std::string plural(int n, const std::string& word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

std::string short_name(const std::string& host) { return host.substr(0, host.find('.')); }

std::string get(const std::map<std::string, std::string>& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list, size_t max_hosts) {
  std::vector<std::string> hosts;
  for (const std::string& item : split_top_level(list, "SLURM_JOB_NODELIST")) {
    if (item.empty()) throw InvalidArgument("SLURM_JOB_NODELIST '" + list + "' has an empty entry");
    expand_name(item, list, max_hosts, &hosts);
  }
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& spec) {
  std::vector<int> tasks;
  size_t nodes = 0;
  for (const std::string& item : split_top_level(spec, "SLURM_TASKS_PER_NODE")) {
    const size_t paren = item.find("(x");
    const std::string count = item.substr(0, paren);
    std::string repeat = "1";
    if (paren != std::string::npos) {
      if (item.back() != ')') throw InvalidArgument("SLURM_TASKS_PER_NODE '" + spec + "': '" + item + "' lacks ')'");
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!all_digits(count) || !all_digits(repeat)) {
      throw InvalidArgument("SLURM_TASKS_PER_NODE '" + spec + "': '" + item + "' is not N or N(xM)");
    }
    nodes += static_cast<size_t>(std::stoi(repeat));
    if (nodes > kMaxSlurmNodes) {
      throw InvalidArgument("SLURM_TASKS_PER_NODE '" + spec + "' gives tasks for more than " +
                            std::to_string(kMaxSlurmNodes) + " nodes, more than ddprun starts a job on: these are "
                            "not one allocation's variables; start ddprun from the job's batch script");
    }
    tasks.insert(tasks.end(), static_cast<size_t>(std::stoi(repeat)), std::stoi(count));
  }
  return tasks;
}

std::string SlurmAllocation::describe() const {
  std::string text = "job " + job_id + " (" + plural(tasks, "task") + " on " +
                     plural(static_cast<int>(nodes.size()), "node") + ": ";
  for (size_t i = 0; i < nodes.size(); ++i) {
    text += (i == 0 ? "" : ",") + nodes[i].host + ":" + std::to_string(nodes[i].slots);
  }
  if (gpus_per_node >= 0) text += "; " + plural(gpus_per_node, "GPU") + " per node";
  return text + ")";
}

std::optional<SlurmAllocation> slurm_allocation(const std::map<std::string, std::string>& env) {
  SlurmAllocation a;
  a.job_id = get(env, "SLURM_JOB_ID");
  if (a.job_id.empty() || !get(env, "SLURM_STEP_ID").empty()) return std::nullopt;
  std::string nodelist = get(env, "SLURM_JOB_NODELIST");
  if (nodelist.empty()) nodelist = get(env, "SLURM_NODELIST");
  const std::string per_node = get(env, "SLURM_TASKS_PER_NODE");
  if (nodelist.empty() || per_node.empty()) {
    throw InvalidArgument("in Slurm job " + a.job_id + " but SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE is not "
                          "set: start ddprun from the job's batch script or salloc's shell, not from a shell that "
                          "kept SLURM_JOB_ID from another job (or unset SLURM_JOB_ID)");
  }
  // The tasks first: they give each node's count, and so bound the host list's expansion.
  const std::vector<int> tasks = expand_slurm_tasks_per_node(per_node);
  const std::vector<std::string> hosts = expand_slurm_hostlist(nodelist, tasks.size());
  if (hosts.size() != tasks.size()) {
    throw InvalidArgument("SLURM_JOB_NODELIST '" + nodelist + "' names " + plural(static_cast<int>(hosts.size()), "node") +
                          " but SLURM_TASKS_PER_NODE '" + per_node + "' gives tasks for " +
                          std::to_string(tasks.size()));
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    a.nodes.push_back(HostSlots{hosts[i], tasks[i]});
    a.tasks += tasks[i];
  }
  const std::string ntasks = get(env, "SLURM_NTASKS");
  if (all_digits(ntasks)) {
    // An allocation holds at least one task: 0 would announce "starting 0 ranks" and then start the default.
    if (std::stoi(ntasks) < 1) {
      throw InvalidArgument("SLURM_NTASKS is " + ntasks + ": an allocation holds at least one task; start ddprun "
                            "from the job's batch script or salloc's shell, or unset SLURM_JOB_ID outside one");
    }
    a.tasks = std::min(a.tasks, std::stoi(ntasks));  // --ntasks=3 on 2 nodes: "2,1" anyway
  }
  if (a.tasks < 1) {
    throw InvalidArgument("SLURM_TASKS_PER_NODE '" + per_node + "' gives no task: an allocation holds at least "
                          "one; start ddprun from the job's batch script or salloc's shell");
  }
  const std::string gpus = get(env, "SLURM_GPUS_ON_NODE");
  if (all_digits(gpus)) {
    a.gpus_per_node = std::stoi(gpus);
  } else if (const std::string ids = get(env, "SLURM_JOB_GPUS"); !ids.empty()) {
    a.gpus_per_node = static_cast<int>(std::count(ids.begin(), ids.end(), ',')) + 1;
  }
  return a;
}

SlurmPlan plan_in_allocation(const LaunchOptions& options, const SlurmAllocation& allocation,
                             const std::string& this_host) {
  SlurmPlan plan;
  plan.options = options;
  if (!options.hosts.empty() || !options.hostfile.empty()) {
    plan.announcement = "ddprun: in Slurm " + allocation.describe() + "; using " +
                        (options.hosts.empty() ? "--hostfile " + options.hostfile : "--hosts " + options.hosts) +
                        " as given";
    return plan;
  }
  if (options.np > allocation.tasks) {
    plan.refusal = "-np " + std::to_string(options.np) + " is more ranks than Slurm " + allocation.describe() +
                   " holds: pass -np " + std::to_string(allocation.tasks) + " or fewer, or ask Slurm for more "
                   "(sbatch --nodes=N --ntasks-per-node=T, one task per GPU)";
    return plan;
  }
  const int np = options.np > 0 ? options.np : allocation.tasks;
  plan.options.np = np;
  const bool here_alone = allocation.nodes.size() == 1 && short_name(allocation.nodes[0].host) == short_name(this_host);
  if (!here_alone) {
    std::string hosts;
    for (const HostSlots& node : allocation.nodes) {
      hosts += (hosts.empty() ? "" : ",") + node.host + ":" + std::to_string(node.slots);
    }
    plan.options.hosts = hosts;
  }
  plan.announcement = "ddprun: in Slurm " + allocation.describe() + "; starting " + plural(np, "rank") +
                      (here_alone ? " on this node" : " over --hosts " + plan.options.hosts) +
                      (options.np > 0 ? " (-np)" : "");
  const int per_node = allocation.nodes.empty() ? 0 : allocation.nodes[0].slots;
  if (allocation.gpus_per_node > per_node) {
    plan.note = "ddprun: note: the allocation has " + plural(allocation.gpus_per_node, "GPU") + " per node but " +
                plural(per_node, "task") + " on its first node, and ddprun starts one rank per task; for one rank "
                "per GPU ask for --ntasks-per-node=" + std::to_string(allocation.gpus_per_node);
  }
  return plan;
}

}  // namespace launcher
}  // namespace ddp
