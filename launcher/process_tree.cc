#include "launcher/process_tree.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "launcher/command.h"

namespace ddp {
namespace launcher {
namespace {

// The program process `pid` runs (/proc/PID/exe), or "" when it cannot be read.
std::string executable_of(pid_t pid) {
  char path[4096];
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), path, sizeof path);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "";
}

}  // namespace

// A file's whole text ("" when it cannot be read): /proc's files, whose size stat does not give.
std::string read_text(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
    std::fclose(f);
  }
  return text;
}

// The processes /proc lists now.
std::vector<pid_t> process_ids() {
  std::vector<pid_t> pids;
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (end != entry->d_name && *end == '\0') pids.push_back(static_cast<pid_t>(pid));
    }
    ::closedir(proc);
  }
  return pids;
}

// Each process's parent, from /proc.
std::map<pid_t, pid_t> parent_links() {
  std::map<pid_t, pid_t> parent_of;
  for (pid_t pid : process_ids()) {
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
    long ppid = 0;
    if (close != std::string::npos && std::sscanf(stat.c_str() + close + 1, " %*c %ld", &ppid) == 1) {
      parent_of[pid] = static_cast<pid_t>(ppid);
    }
  }
  return parent_of;
}

// The processes below `root` on this node (its children, theirs, ...).
std::vector<pid_t> descendants(pid_t root, const std::map<pid_t, pid_t>& parent_of) {
  std::vector<pid_t> below;
  for (const auto& [pid, ppid] : parent_of) {
    bool below_root = false;
    for (pid_t up = ppid, hops = 0; up > 1 && hops < 64 && !below_root; ++hops) {
      below_root = up == root;
      const auto it = parent_of.find(up);
      up = it == parent_of.end() ? 0 : it->second;
    }
    if (below_root) below.push_back(pid);
  }
  return below;
}

// The rank wrappers on this node among the descendants of `root` (mpirun): /proc's parent links, then each
// one's command line and program.
std::vector<pid_t> local_rank_wrappers(pid_t root) {
  const std::string self = executable_of(::getpid());
  std::map<pid_t, pid_t> parent_of = parent_links();
  std::vector<pid_t> wrappers;
  for (pid_t pid : descendants(root, parent_of)) {
    const std::string cmdline = read_text("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.find(std::string(kRankWrapperFlag) + '\0') == std::string::npos) continue;
    // mpirun's own child between its fork and the exec of the wrapper has mpirun's command line, which holds the
    // wrapper's flag too, and mpirun's handlers: a stop sent to it then would kill the rank as it starts. A
    // wrapper runs this very program.
    if (executable_of(pid) != self) continue;
    wrappers.push_back(pid);
  }
  // A wrapper's child between its fork and the exec of the program still has the wrapper's command line: it is
  // not a wrapper (a stop sent to it then would kill it).
  std::vector<pid_t> outermost;
  for (pid_t pid : wrappers) {
    if (std::find(wrappers.begin(), wrappers.end(), parent_of[pid]) == wrappers.end()) outermost.push_back(pid);
  }
  return outermost;
}

// Whether process `pid` catches `sig` (its handler is installed): the SigCgt mask of /proc/PID/status.
bool catches_signal(pid_t pid, int sig) {
  const std::string status = read_text("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("\nSigCgt:");
  if (at == std::string::npos) return false;
  const unsigned long long mask = std::strtoull(status.c_str() + at + 8, nullptr, 16);
  return (mask >> (sig - 1)) & 1ULL;
}


}  // namespace launcher
}  // namespace ddp
