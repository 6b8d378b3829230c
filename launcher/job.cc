// fork/exec with two pipes, one poll loop relaying both, SIGINT/SIGTERM forwarded to the child.
#include "launcher/job.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "launcher/command.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_interrupted = 0;

void forward_signal(int sig) {
  g_interrupted = 1;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), sig);
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout is gone (a closed pipe): keep draining the child so it does not block
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// Accumulates one pipe's bytes and emits complete lines.
struct LineRelay {
  int fd;
  int default_out;  // where untagged lines from this pipe go
  std::string pending;
  bool open = true;
};

void emit(const std::string& line, int default_out, FailureTracker* tracker) {
  tracker->observe(line);
  int rank = 0, status = 0;
  long long time_ns = 0;
  if (parse_exit_marker(line, &rank, &status, &time_ns)) return;
  const TaggedLine t = parse_tagged_line(line);
  const int out = t.tagged ? (t.stream == "stdout" ? STDOUT_FILENO : STDERR_FILENO) : default_out;
  write_all(out, rewrite_tagged_line(line) + "\n");
}

}  // namespace

JobResult run_job(const std::vector<std::string>& argv) {
  DDP_CHECK(!argv.empty(), "run_job: empty command");
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  struct sigaction action {}, old_int{}, old_term{};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);
  g_interrupted = 0;

  const pid_t child = ::fork();
  if (child < 0) throw Error(std::string("ddprun: fork failed: ") + std::strerror(errno));
  if (child == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvp(args[0], args.data());
    const std::string message = std::string("ddprun: cannot run ") + args[0] + ": " + std::strerror(errno) +
                                (errno == ENOENT ? " (is Open MPI installed? apt-get install openmpi-bin)" : "") +
                                "\n";
    write_all(STDERR_FILENO, message);
    ::_exit(127);
  }
  g_child = child;
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);

  FailureTracker tracker;
  LineRelay relays[2] = {{out_pipe[0], STDOUT_FILENO, "", true}, {err_pipe[0], STDERR_FILENO, "", true}};
  char buffer[1 << 16];
  while (relays[0].open || relays[1].open) {
    pollfd fds[2];
    nfds_t n = 0;
    LineRelay* which[2];
    for (LineRelay& r : relays) {
      if (!r.open) continue;
      fds[n] = {r.fd, POLLIN, 0};
      which[n++] = &r;
    }
    if (::poll(fds, n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (nfds_t i = 0; i < n; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      LineRelay& r = *which[i];
      const ssize_t got = ::read(r.fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        if (!r.pending.empty()) emit(r.pending, r.default_out, &tracker);
        r.pending.clear();
        r.open = false;
        ::close(r.fd);
        continue;
      }
      r.pending.append(buffer, static_cast<size_t>(got));
      size_t start = 0;
      for (size_t nl; (nl = r.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        emit(r.pending.substr(start, nl - start), r.default_out, &tracker);
      }
      r.pending.erase(0, start);
    }
  }
  for (LineRelay& r : relays) {
    if (r.open) ::close(r.fd);
  }

  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);

  JobResult result;
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  result.first_failed_rank = tracker.first_failed_rank();
  result.first_failure_how = tracker.first_failure_how();
  result.interrupted = g_interrupted != 0;
  return result;
}

int run_rank_wrapper(const std::vector<std::string>& program) {
  if (program.empty()) {
    write_all(STDERR_FILENO, "ddprun: rank wrapper: no program given\n");
    return 2;
  }
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank_env == nullptr) rank_env = std::getenv("PMIX_RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;
  std::vector<char*> args;
  for (const std::string& a : program) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    write_all(STDERR_FILENO, std::string("ddprun: rank wrapper: fork failed: ") + std::strerror(errno) + "\n");
    return 1;
  }
  if (child == 0) {
    // If mpirun SIGKILLs the wrapper, the program must not live on as an orphan holding its GPU.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvp(args[0], args.data());
    write_all(STDERR_FILENO, std::string("ddprun: cannot run ") + args[0] + ": " + std::strerror(errno) + "\n");
    ::_exit(127);
  }
  g_child = child;
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = 0;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  if (code != 0) {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    write_all(STDERR_FILENO, exit_marker(rank, code, now.tv_sec * 1000000000LL + now.tv_nsec) + "\n");
  }
  return code;
}

}  // namespace launcher
}  // namespace ddp
