#include "launcher/dump.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "launcher/caught_signals.h"
#include "launcher/command.h"
#include "launcher/process_tree.h"

namespace ddp {
namespace launcher {
namespace {

// A ddprun that runs a job: its name is ddprun and it is neither a rank's wrapper nor a --dump like us.
bool runs_a_job(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  std::string comm = read_text(dir + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  if (comm != "ddprun") return false;
  std::string cmdline = read_text(dir + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return cmdline.find(std::string(" ") + kRankWrapperFlag) == std::string::npos &&
         cmdline.find(" --dump") == std::string::npos;
}

std::vector<pid_t> running_jobs() {
  std::vector<pid_t> jobs;
  for (pid_t pid : process_ids()) {
    if (pid == ::getpid()) continue;
    struct stat info {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &info) != 0 || info.st_uid != ::getuid()) continue;
    if (runs_a_job(pid)) jobs.push_back(pid);
  }
  return jobs;
}

}  // namespace

int dump_job(const std::vector<std::string>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "ddprun: error: --dump takes at most one pid: ddprun --dump [PID]\n");
    return 2;
  }
  pid_t pid = 0;
  if (args.size() == 1) {
    char* end = nullptr;
    const long value = std::strtol(args[0].c_str(), &end, 10);
    if (end == args[0].c_str() || *end != '\0' || value <= 0) {
      std::fprintf(stderr, "ddprun: error: --dump %s: not a pid (ddprun --dump [PID])\n", args[0].c_str());
      return 2;
    }
    pid = static_cast<pid_t>(value);
    if (!runs_a_job(pid)) {
      std::fprintf(stderr, "ddprun: --dump %d: no ddprun running a job has this pid\n", static_cast<int>(pid));
      return 1;
    }
  } else {
    const std::vector<pid_t> jobs = running_jobs();
    if (jobs.size() != 1) {
      std::string list;
      for (pid_t p : jobs) list += " " + std::to_string(p);
      std::fprintf(stderr, "ddprun: --dump: %s; name one: ddprun --dump PID\n",
                   jobs.empty() ? "no ddprun of yours is running a job"
                                : ("several ddprun jobs of yours are running (pids" + list + ")").c_str());
      return 1;
    }
    pid = jobs[0];
  }
  if (::kill(pid, kDumpSignal) != 0) {
    std::fprintf(stderr, "ddprun: --dump: cannot signal %d: %s\n", static_cast<int>(pid), std::strerror(errno));
    return 1;
  }
  std::fprintf(stderr, "ddprun: asked the job of ddprun %d for its flight recorders (SIGUSR2): each rank prints "
               "its last collectives and its phase to that job's output\n", static_cast<int>(pid));
  return 0;
}

}  // namespace launcher
}  // namespace ddp
