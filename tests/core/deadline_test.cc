// Deadlines count the time the process ran: a process stopped (SIGSTOP, as Ctrl-Z or Slurm's suspend do) and
// continued finds its deadline as far away as when it stopped, while one that runs sees it pass on time.
#include "runtime/core/deadline.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Polls `deadline` every 10 ms, as a waiter does, until it passes; the wall seconds that took.
double wall_seconds_until_passed(const Deadline& deadline) {
  const Clock::time_point start = Clock::now();
  while (!deadline.passed()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return seconds_since(start);
}

TEST(Deadline, PassesOnTimeInAProcessThatRuns) {
  const double took = wall_seconds_until_passed(Deadline(0.3));
  EXPECT_GE(took, 0.29);
  // Later only by what a loaded machine keeps this thread from running (a gap left out as if stopped).
  EXPECT_LT(took, 2.0);
}

TEST(Deadline, LeavesOutTheTimeTheProcessWasStopped) {
  const Clock::time_point start = Clock::now();
  const Deadline deadline(1.0);
  // This process stops itself at a known point; a child continues it once it has been stopped for 2 s. The child
  // waits for the stop, so however late it is scheduled, the stop lasts 2 s and never outlives the test.
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    while (!process_stopped(parent)) {
      if (getppid() != parent) _exit(1);  // the test ended without stopping
      usleep(1000);
    }
    usleep(2000000);
    kill(parent, SIGCONT);
    _exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(deadline.passed());
  raise(SIGSTOP);
  const double stopped_after = seconds_since(start);
  EXPECT_GE(stopped_after, 2.0) << "the process was not stopped for the 2 s the child keeps it";
  EXPECT_FALSE(deadline.passed()) << "the deadline counted the time the process was stopped";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // It passes once the process has run for its 1 s: about 3 s of wall time in all, never less.
  wall_seconds_until_passed(deadline);
  const double wall = seconds_since(start);
  EXPECT_GE(wall, 2.9);
  EXPECT_LT(wall, 8.0);
}

}  // namespace
}  // namespace ddp
