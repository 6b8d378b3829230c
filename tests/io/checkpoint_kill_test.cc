// A process killed (SIGKILL) at any moment of a checkpoint write leaves the previous checkpoint valid and the
// one that resume picks: a child writes 4 MiB checkpoints in a loop and is killed after a random delay, over
// and over; after every kill the newest complete checkpoint must load and verify, and no file under a final
// name may be partial. The kill delays are scaled to the time one write takes on this machine (measured in the
// first round, which waits for a completed write), so the kills land inside writes on a fast machine and on a
// loaded CI machine under a sanitizer alike.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "runtime/io/checkpoint.h"
#include "runtime/io/loaded_checkpoint.h"
#include "tests/scratch.h"

namespace ddp::io {
namespace {

// Writes checkpoints until killed; after each completed one it writes a byte to `done_fd` so the parent knows.
[[noreturn]] void write_forever(const std::string& dir, std::int64_t first_step, int done_fd) {
  std::vector<float> weights(1 << 20);
  for (std::int64_t step = first_step;; ++step) {
    for (std::size_t i = 0; i < weights.size(); i += 4096) weights[i] = static_cast<float>(step);
    CheckpointMetadata m;
    m.step = step;
    save_checkpoint(dir, m, {TensorSource{"0.weight", DType::kFloat32, {1024, 1024}, weights.data(), weights.size() * 4}},
                    /*keep_last=*/2);
    const char byte = 1;
    if (write(done_fd, &byte, 1) != 1) _exit(3);
  }
}

// Blocks until the child reports a completed checkpoint or `timeout_ms` passes; true when one was reported.
bool wait_for_completed_write(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

TEST(CheckpointKill, KillDuringWritesAlwaysLeavesAValidCheckpoint) {
  const std::string dir = ddp::testing::fresh_scratch_dir("kill");
  std::mt19937 rng(12345);
  std::int64_t newest = 0;
  int max_delay_us = 0;  // set in round 0 from the measured time of one write
  for (int round = 0; round < 25; ++round) {
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    const auto started = std::chrono::steady_clock::now();
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(pipe_fds[0]);
      write_forever(dir, newest + 1, pipe_fds[1]);
    }
    close(pipe_fds[1]);
    if (round == 0) {
      // A baseline: one checkpoint completes before any kill, however slow the machine is.
      ASSERT_TRUE(wait_for_completed_write(pipe_fds[0], 120000)) << "the child completed no checkpoint in 120 s";
      const auto write_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - started).count();
      // Kills land anywhere in the first few writes of a child, startup included.
      max_delay_us = static_cast<int>(std::clamp<std::int64_t>(3 * write_us, 20000, 2000000));
    }
    usleep(std::uniform_int_distribution<int>(1000, max_delay_us)(rng));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    close(pipe_fds[0]);
    std::vector<std::string> warnings;
    auto latest = latest_complete_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
    ASSERT_TRUE(latest.has_value()) << "round " << round << ": no complete checkpoint; the previous one was lost";
    EXPECT_GE(latest->metadata.step, newest) << "round " << round;
    EXPECT_TRUE(warnings.empty()) << "round " << round << ": a file under a final name was partial: " << warnings[0];
    newest = latest->metadata.step;
  }
}

}  // namespace
}  // namespace ddp::io
