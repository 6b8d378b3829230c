#include "launcher/probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "launcher/caught_signals.h"
#include "launcher/child_process.h"
#include "launcher/clock.h"
#include "launcher/command.h"
#include "launcher/relay.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

// What a probe's output says about its host: its facts, or the first line that says what went wrong.
HostAnswer read_probe_output(const std::string& output, int status, bool timed_out, int timeout_ms) {
  HostAnswer answer;
  std::string first;
  size_t start = 0;
  for (size_t nl; start < output.size(); start = nl + 1) {
    nl = output.find('\n', start);
    if (nl == std::string::npos) nl = output.size();
    std::string line = output.substr(start, nl - start);
    // ssh ends its messages with "\r\n".
    line.erase(std::remove(line.begin(), line.end(), '\r'), line.end());
    if (const std::optional<HostFacts> facts = parse_probe_line(line)) {
      answer.facts = *facts;
      answer.reachable = true;
    } else if (first.empty() && line.find_first_not_of(" -") != std::string::npos) {
      first = parse_tagged_line(line).text;
    }
  }
  if (answer.reachable && status == 0) return answer;
  answer.reachable = false;
  if (timed_out) {
    answer.error = "no answer within " + std::to_string(timeout_ms / 1000) + " s" + (first.empty() ? "" : ": " + first);
  } else {
    answer.error = first.empty() ? "mpirun's status " + std::to_string(status) : first;
  }
  return answer;
}


// One host's probe under way.
struct Probe {
  pid_t pid = -1;
  int fd = -1;  // the read end of its output; -1 once closed
  std::string output;
  std::string session_base;  // this probe's mpirun's own session directories; removed after it
};

// Starts the probe of `host`: mpirun with its output (stdout and stderr) on a pipe, in a process group of its
// own, ended by SIGTERM if ddprun (`parent`) dies.
Probe start_probe(const std::string& host, const MachineFacts& facts, const std::string& self, pid_t parent) {
  Probe probe;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
  probe.session_base = private_directory("ddprun-probe");
  const std::vector<std::string> argv = build_probe_command(host, facts, self, probe.session_base);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("ddprun: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(128 + SIGTERM);
    restore_signal_dispositions();
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    exec_or_exit(argv, "");
  }
  ::setpgid(pid, pid);
  ::close(pipe_fds[1]);
  probe.pid = pid;
  probe.fd = pipe_fds[0];
  return probe;
}

// Reads the probes' output until each has closed its pipe or `timeout_ms` has passed.
void read_probes(std::vector<Probe>& probes, int timeout_ms) {
  const long long deadline = monotonic_ms() + timeout_ms;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Probe*> which;
    for (Probe& p : probes) {
      if (p.fd < 0) continue;
      fds.push_back({p.fd, POLLIN, 0});
      which.push_back(&p);
    }
    const long long left = deadline - monotonic_ms();
    if (fds.empty() || left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t got = ::read(which[k]->fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(which[k]->fd);
        which[k]->fd = -1;
      } else if (which[k]->output.size() < (1 << 16)) {
        which[k]->output.append(buffer, static_cast<size_t>(got));
      }
    }
  }
}

// A probe's answer once its reading is over: killed first when it still runs (it timed out), then reaped and
// its session directories removed.
HostAnswer finish_probe(Probe& p, int timeout_ms) {
  const bool timed_out = p.fd >= 0;
  if (timed_out) {
    ::killpg(p.pid, SIGKILL);
    ::close(p.fd);
  }
  int status = 0;
  while (::waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (!p.session_base.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(p.session_base, ignored);
  }
  return read_probe_output(p.output, code, timed_out, timeout_ms);
}

}  // namespace

std::vector<HostAnswer> probe_hosts(const std::vector<HostSlots>& hosts, const MachineFacts& facts,
                                    const std::string& self, int timeout_ms) {
  std::vector<Probe> probes;
  const pid_t parent = ::getpid();
  for (const HostSlots& host : hosts) probes.push_back(start_probe(host.host, facts, self, parent));
  read_probes(probes, timeout_ms);
  std::vector<HostAnswer> answers;
  for (Probe& p : probes) answers.push_back(finish_probe(p, timeout_ms));
  return answers;
}

}  // namespace launcher
}  // namespace ddp
