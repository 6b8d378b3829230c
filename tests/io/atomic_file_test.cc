// Atomic writes: the destination holds the old bytes or the new, never a mix, and no temporary file is left.
#include "runtime/io/atomic_file.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/scratch.h"

namespace ddp {
namespace io {
namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (const dirent* e = ::readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

TEST(AtomicFile, WritesAndReplaces) {
  const std::string dir = ddp::testing::scratch_dir("atomic-replace");
  const std::string path = dir + "/file.bin";
  write_file_atomically(path, std::string("first"));
  EXPECT_EQ(read_file(path), "first");
  write_file_atomically(path, std::string("second, longer"));
  EXPECT_EQ(read_file(path), "second, longer");
  EXPECT_EQ(entries(dir), std::vector<std::string>{"file.bin"});
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);
}

TEST(AtomicFile, AFailingWriterLeavesTheOldFileIntact) {
  const std::string dir = ddp::testing::scratch_dir("atomic-fail");
  const std::string path = dir + "/ckpt.bin";
  write_file_atomically(path, std::string("the good old checkpoint"));
  const std::string big(1 << 20, 'x');
  EXPECT_THROW(write_file_atomically(path,
                                     [&](const ByteSink& sink) {
                                       sink(big.data(), big.size());  // half the new file is on disk...
                                       throw std::runtime_error("killed midway");  // ...then the writer dies
                                     }),
               std::runtime_error);
  EXPECT_EQ(read_file(path), "the good old checkpoint");
  EXPECT_EQ(entries(dir), std::vector<std::string>{"ckpt.bin"});  // the temporary file is gone
}

TEST(AtomicFile, FailingFirstWriteCreatesNothing) {
  const std::string dir = ddp::testing::scratch_dir("atomic-fail-new");
  EXPECT_THROW(write_file_atomically(dir + "/new.bin", [](const ByteSink&) { throw std::runtime_error("no"); }),
               std::runtime_error);
  EXPECT_TRUE(entries(dir).empty());
}

TEST(AtomicFile, MissingDirectoryIsAClearError) {
  try {
    write_file_atomically("/nonexistent-dir-ddp/x.bin", std::string("x"));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("directory /nonexistent-dir-ddp does not exist"), std::string::npos);
  }
  EXPECT_THROW(read_file("/nonexistent-dir-ddp/x.bin"), InvalidArgument);
}

TEST(AtomicFile, CheckingAPathUpFrontLeavesNothingAndRefusesWhatAWriteWould) {
  const std::string dir = ddp::testing::scratch_dir("atomic-check");
  check_can_write_atomically(dir + "/out.json");
  EXPECT_TRUE(entries(dir).empty());  // the probe is gone, and no file was created
  EXPECT_THROW(check_can_write_atomically("/nonexistent-dir-ddp/x.json"), InvalidArgument);
  try {
    check_can_write_atomically(dir);
    FAIL() << "accepted a directory as a file name";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("it is a directory"), std::string::npos) << e.what();
  }
  // Under /proc nothing can be created.
  EXPECT_THROW(check_can_write_atomically("/proc/ddp-trace.json"), InvalidArgument);
}

TEST(AtomicFile, TemporaryNames) {
  EXPECT_TRUE(is_temporary_file(".ckpt-00000001.safetensors.tmp-a1B2c3"));
  EXPECT_FALSE(is_temporary_file("ckpt-00000001.safetensors"));
  EXPECT_FALSE(is_temporary_file(".tmp-abcdef"));
  EXPECT_EQ(dirname_of("a/b/c"), "a/b");
  EXPECT_EQ(dirname_of("c"), ".");
  EXPECT_EQ(dirname_of("/c"), "/");
  EXPECT_EQ(basename_of("a/b/c"), "c");
}

}  // namespace
}  // namespace io
}  // namespace ddp
