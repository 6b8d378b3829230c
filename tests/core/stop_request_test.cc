// Stop requests: the first SIGTERM/SIGINT/SIGUSR1 only sets the flag (the process goes on, its syscalls restart),
// more within 1 s are the same stop (Slurm's signal to every process of the job reaches a rank directly and
// through its wrapper), a second one later ends the process as the signal would, and a signal the process was
// started with ignored stays ignored. Each case runs in a child of its own, since handlers are installed once per process.
#include "runtime/core/stop_request.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

namespace ddp {
namespace {

// Runs `body` in a forked child; returns its wait status. The child exits 0 when body returns true.
int in_child(const std::function<bool()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(StopRequest, TheFirstSignalAsksTheSecondEnds) {
  for (int signal : {SIGTERM, SIGINT}) {
    const int status = in_child([signal] {
      install_stop_handlers();
      install_stop_handlers();  // a second call changes nothing
      if (stop_requested()) return false;
      std::raise(signal);
      if (!stop_requested() || stop_signal() != signal) return false;
      if (seconds_since_stop_request() < 0.0 || seconds_since_stop_request() > 5.0) return false;
      usleep(1100 * 1000);  // past the window in which a signal counts as the first one again
      std::raise(signal);  // ends the child: the next line is not reached
      return false;
    });
    EXPECT_TRUE(WIFSIGNALED(status)) << "signal " << signal << ": status " << status;
    if (WIFSIGNALED(status)) {
      EXPECT_EQ(WTERMSIG(status), signal);
    }
  }
}

TEST(StopRequest, SignalsWithinASecondOfTheFirstAreTheSameStop) {
  const int status = in_child([] {
    install_stop_handlers();
    std::raise(SIGTERM);  // Slurm's, to the rank
    std::raise(SIGTERM);  // the same, through the rank's wrapper
    std::raise(SIGUSR1);  // ddprun's, through mpirun
    return stop_requested() && stop_signal() == SIGTERM;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

// ddprun passes a stop on as SIGUSR1: after a user's SIGTERM to the rank itself, it is the same request, not a
// second one (it used to end the rank, killed by SIGUSR1).
TEST(StopRequest, SigusrOneOnlyEverAsks) {
  for (int first : {SIGTERM, SIGUSR1}) {
    const int status = in_child([first] {
      install_stop_handlers();
      std::raise(first);
      std::raise(SIGUSR1);
      std::raise(SIGUSR1);
      return stop_requested() && stop_signal() == first;
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "first " << first << ": status " << status;
  }
}

TEST(StopRequest, ANotedStopIsNoRequestOfThisProcess) {
  const int status = in_child([] {
    install_stop_handlers();
    note_stopping();
    if (!stopping() || stop_requested()) return false;
    std::raise(SIGTERM);  // the first request here: it asks, it does not end
    return stop_requested();
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(StopRequest, ASignalIgnoredAtStartStaysIgnored) {
  const int status = in_child([] {
    std::signal(SIGTERM, SIG_IGN);  // as under nohup
    install_stop_handlers();
    std::raise(SIGTERM);
    std::raise(SIGTERM);
    return !stop_requested();
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(StopRequest, RequestStopAsksWithoutASignal) {
  const int status = in_child([] {
    install_stop_handlers();
    request_stop();
    return stop_requested() && stop_signal() == 0;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace ddp
