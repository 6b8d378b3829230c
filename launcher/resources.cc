#include "launcher/resources.h"

#include <algorithm>
#include <cstdio>

#include "launcher/command.h"

namespace ddp {
namespace launcher {
namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

long long open_files_needed(int ranks_here) { return 32 + 6LL * std::max(ranks_here, 0); }

std::string open_files_refusal(int ranks_here, long long limit) {
  const long long needed = open_files_needed(ranks_here);
  if (limit >= needed) return "";
  return "the open files limit (ulimit -n) is " + std::to_string(limit) + ", too few for mpirun to start " +
         std::to_string(ranks_here) + " rank" + (ranks_here == 1 ? "" : "s") + " here (it needs about " +
         std::to_string(needed) + "; it would wait forever): raise it, e.g. ulimit -n " +
         std::to_string(std::max(1024LL, needed)) + ", or ask for a higher hard limit";
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

}  // namespace launcher
}  // namespace ddp
