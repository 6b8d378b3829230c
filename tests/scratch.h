// Where a test may write files: under Bazel's TEST_TMPDIR, or under /tmp when a test binary runs outside Bazel
// (the GPU machine runs the bundled binaries directly). One definition for every test that writes.
#pragma once

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

}  // namespace ddp::testing
