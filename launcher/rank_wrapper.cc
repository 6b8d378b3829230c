#include "launcher/rank_wrapper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "launcher/caught_signals.h"
#include "launcher/child_process.h"
#include "launcher/clock.h"
#include "launcher/failure_tracker.h"
#include "launcher/process_tree.h"
#include "runtime/core/start_marker.h"
#include "runtime/core/stop_request.h"

namespace ddp {
namespace launcher {
namespace {

volatile sig_atomic_t g_program = 0;  // the wrapper's child
volatile sig_atomic_t g_told_to_stop = 0;
volatile sig_atomic_t g_asked_to_stop = 0;  // a graceful stop (SIGUSR1), handed on from the wait loop

void forward_to_program(int sig) {
  g_told_to_stop = 1;
  if (g_program > 0) ::kill(static_cast<pid_t>(g_program), sig);
}

void forward_dump_to_program(int sig) {
  if (g_program > 0) ::kill(static_cast<pid_t>(g_program), sig);
}

void note_stop_request(int) { g_asked_to_stop = 1; }

// A graceful stop asked of this rank: SIGUSR1 to a program that handles it (the runtime's stop handlers finish
// the step and write a checkpoint), SIGTERM to one that does not (SIGUSR1 would kill it as a failure).
void hand_on_stop_request(pid_t program) {
  if (catches_signal(program, SIGUSR1)) {
    ::kill(program, SIGUSR1);
  } else {
    g_told_to_stop = 1;
    ::kill(program, SIGTERM);
  }
}

// The wrapper's handlers: SIGINT and SIGTERM go on to the program, SIGUSR2 (a dump) too without interrupting
// the wait, and a graceful stop is noted for the wait loop to hand on.
void route_signals_to_program() {
  struct sigaction action {};
  action.sa_handler = forward_to_program;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  struct sigaction dump {};
  dump.sa_handler = forward_dump_to_program;
  sigemptyset(&dump.sa_mask);
  dump.sa_flags = SA_RESTART;
  ::sigaction(kDumpSignal, &dump, nullptr);
  struct sigaction graceful {};
  graceful.sa_handler = note_stop_request;  // no SA_RESTART: the wait returns to hand it on
  sigemptyset(&graceful.sa_mask);
  ::sigaction(kGracefulStopSignal, &graceful, nullptr);
}

// The child's side of the wrapper's fork: the program, with the signals' default actions back.
[[noreturn]] void exec_program(const std::vector<std::string>& program, pid_t parent) {
  // If mpirun SIGKILLs the wrapper, the program must not live on as an orphan holding its GPU.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  // A process group of its own: mpirun signals the wrapper's group, and every signal must reach the program
  // once, through the wrapper (a graceful stop that came twice would be taken for the user insisting).
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, kDumpSignal, kGracefulStopSignal}) ::signal(sig, SIG_DFL);
  exec_or_exit(program, "ddprun: ");
}

// Whether `child` has exec'ed its program: until then it is a copy of the wrapper, which catches SIGUSR1 with
// the wrapper's handler (a stop handed to it then would be lost in the exec).
bool runs_its_program(pid_t child) {
  char self[4096], exe[4096];
  const ssize_t a = ::readlink("/proc/self/exe", self, sizeof self);
  const ssize_t b = ::readlink(("/proc/" + std::to_string(child) + "/exe").c_str(), exe, sizeof exe);
  return a > 0 && b > 0 && std::string(self, static_cast<size_t>(a)) != std::string(exe, static_cast<size_t>(b));
}

// How long after its start a program may take to catch SIGUSR1 (its stop handlers are installed first thing
// in main, but loading it can take seconds on a loaded node): a graceful stop asked before is held until it
// does, or until then, and is then handed on as SIGTERM, as to a program that does not handle it.
constexpr int kStopHoldMs = 10000;

// Waits for the program, handing on (once) a graceful stop asked before or meanwhile, as soon as the program
// can take it; its exit code, or 128 + the signal that ended it (`*signal` set to that signal).
int wait_for_program(pid_t child, long long started_ms, int* signal) {
  g_program = child;
  if (g_told_to_stop) ::kill(child, SIGTERM);  // told before the program existed
  int status = 0;
  bool handed_on = false;
  for (;;) {
    if (g_asked_to_stop && !handed_on) {
      if ((runs_its_program(child) && catches_signal(child, SIGUSR1)) ||
          monotonic_ms() - started_ms >= kStopHoldMs) {
        handed_on = true;
        hand_on_stop_request(child);
      }
    }
    if (g_asked_to_stop && !handed_on) {
      // Held until the program catches SIGUSR1: look again shortly.
      const pid_t got = ::waitpid(child, &status, WNOHANG);
      if (got == child || (got < 0 && errno != EINTR)) break;
      ::usleep(5000);
      continue;
    }
    if (::waitpid(child, &status, 0) >= 0 || errno != EINTR) break;
  }
  g_program = 0;
  *signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}


// The marker of a program that ended with `code` (`signal` when a signal ended it), printed to stderr for
// mpirun to relay and left in the exit directory (kExitDirVariable) when there is one.
void report_exit(int rank, int code, int signal) {
  ExitMarker marker;
  marker.rank = rank;
  marker.status = code;
  marker.time_ns = realtime_ns();
  // A program that stopped as asked (ddp::kStoppedExitStatus) has not failed either.
  marker.stopped = g_told_to_stop != 0 || code == kStoppedExitStatus;
  // Asked to stop by a signal sent to the program itself, not through us (one that ended it, or a second
  // one that ended it at once), or a stop that failed (its checkpoint could not be written): a stop, which
  // is never restarted, whatever its status.
  marker.asked_to_stop = code == kStopFailedExitStatus ||
                         (g_told_to_stop == 0 && (signal == SIGTERM || signal == SIGINT || signal == SIGUSR1));
  write_all(STDERR_FILENO, exit_marker(marker) + "\n");
  if (const char* dir = std::getenv(kExitDirVariable)) {
    const std::string path = std::string(dir) + "/rank-" + std::to_string(rank);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      write_all(fd, exit_marker(marker) + "\n");
      ::close(fd);
    }
  }
}

}  // namespace

int run_rank_wrapper(const std::vector<std::string>& program) {
  // If mpirun (or orted) dies without ending us (SIGKILLed, or crashed), end with it rather than run on as an
  // orphan; the program follows by its own parent-death signal. A parent that died before prctl took effect
  // shows as a changed parent pid.
  const pid_t launcher = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) return 128 + SIGKILL;
  if (program.empty()) {
    write_all(STDERR_FILENO, "ddprun: rank wrapper: no program given\n");
    return 2;
  }
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank_env == nullptr) rank_env = std::getenv("PMIX_RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;

  route_signals_to_program();
  ::setenv(kStartMarkersVariable, "1", 1);  // the program's runtime tells ddprun of its start (start_watch.h)
  const pid_t parent = ::getpid();
  const long long started_ms = monotonic_ms();
  const pid_t child = ::fork();
  if (child < 0) {
    write_all(STDERR_FILENO, std::string("ddprun: rank wrapper: fork failed: ") + std::strerror(errno) + "\n");
    return 1;
  }
  if (child == 0) exec_program(program, parent);
  int signal = 0;
  const int code = wait_for_program(child, started_ms, &signal);
  if (code != 0) report_exit(rank, code, signal);
  // ddprun learns of the stop from the marker; to mpirun it is a normal end (it would abort the others' ends
  // and print its failure banner for a non-zero status).
  return code == kStoppedExitStatus ? 0 : code;
}

}  // namespace launcher
}  // namespace ddp
