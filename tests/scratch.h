// Where a test may write files: under Bazel's TEST_TMPDIR, or under /tmp when a test binary runs outside Bazel
// (the GPU machine runs the bundled binaries directly). One definition for every test that writes.
#pragma once

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ddp::testing {

// The path `name` in the test's scratch directory (nothing is created).
inline std::string scratch_path(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base != nullptr ? base : "/tmp") + "/" + name;
}

// scratch_path(name) as a directory that exists (made if missing; what it holds stays).
inline std::string scratch_dir(const std::string& name) {
  const std::string dir = scratch_path(name);
  std::filesystem::create_directories(dir);
  return dir;
}

// scratch_path(name) as an empty directory: whatever an earlier run left there is removed first.
inline std::string fresh_scratch_dir(const std::string& name) {
  const std::string dir = scratch_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Writes past `bytes` in any file fail while this lives (RLIMIT_FSIZE: EFBIG, the write that crosses the limit
// short): a full disk, as a test can make one without a file system of its own.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);  // else the signal ends the process
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*previous_)(int) = nullptr;
};

}  // namespace ddp::testing
