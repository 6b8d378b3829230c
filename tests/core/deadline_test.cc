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
  const Deadline deadline(3.0);
  // A child stops this process for 2 s, then continues it (the deadline is long enough for the child to start
  // on a loaded machine).
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    kill(parent, SIGSTOP);
    usleep(2000000);
    kill(parent, SIGCONT);
    _exit(0);
  }
  // Waits as a waiter does until the stop has come and gone: a reading much later than the previous one.
  Clock::time_point previous = Clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const bool passed = deadline.passed();
    const Clock::time_point now = Clock::now();
    if (now - previous > std::chrono::milliseconds(1500)) {
      EXPECT_FALSE(passed) << "the deadline counted the " << std::chrono::duration<double>(now - previous).count()
                           << " s the process was stopped";
      break;
    }
    ASSERT_FALSE(passed) << "the deadline passed before the stop came";
    previous = now;
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // It passes once the process has run for its 3 s: about 5 s of wall time in all, never less.
  wall_seconds_until_passed(deadline);
  const double wall = seconds_since(start);
  EXPECT_GE(wall, 4.9);
  EXPECT_LT(wall, 8.0);
}

}  // namespace
}  // namespace ddp
