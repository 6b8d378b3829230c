// A process killed (SIGKILL) at any moment of a checkpoint write leaves the previous checkpoint valid and the
// one that resume picks: a child writes 4 MiB checkpoints in a loop and is killed after a random delay, over
// and over; after every kill the newest complete checkpoint must load and verify, and no file under a final
// name may be partial.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/io/checkpoint.h"

namespace ddp::io {
namespace {

std::string scratch(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  return dir;
}

[[noreturn]] void write_forever(const std::string& dir, std::int64_t first_step) {
  std::vector<float> weights(1 << 20);
  for (std::int64_t step = first_step;; ++step) {
    for (std::size_t i = 0; i < weights.size(); i += 4096) weights[i] = static_cast<float>(step);
    CheckpointMetadata m;
    m.step = step;
    save_checkpoint(dir, m, {TensorSource{"0.weight", DType::kF32, {1024, 1024}, weights.data(), weights.size() * 4}},
                    /*keep_last=*/2);
  }
}

TEST(CheckpointKill, KillDuringWritesAlwaysLeavesAValidCheckpoint) {
  const std::string dir = scratch("kill");
  std::mt19937 rng(12345);
  std::int64_t newest = 0;
  for (int round = 0; round < 25; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) write_forever(dir, newest + 1);
    usleep(std::uniform_int_distribution<int>(2000, 60000)(rng));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    std::vector<std::string> warnings;
    auto latest = latest_complete_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
    if (!latest) {
      // Killed before its first write completed: only allowed when there has never been a checkpoint.
      ASSERT_EQ(newest, 0) << "round " << round << ": the previous checkpoint was lost";
      continue;
    }
    EXPECT_GE(latest->metadata.step, newest) << "round " << round;
    EXPECT_TRUE(warnings.empty()) << "round " << round << ": a file under a final name was partial: " << warnings[0];
    newest = latest->metadata.step;
  }
  EXPECT_GT(newest, 0) << "no checkpoint was ever completed";
}

}  // namespace
}  // namespace ddp::io
