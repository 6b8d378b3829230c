// What a path names: readers open regular files only (a FIFO, a directory or a device is refused before it is
// opened, within a bound, never blocking), and two paths are compared as files, not as strings.
#include "runtime/io/file_identity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/safetensors.h"
#include "tests/error_message.h"
#include "tests/scratch.h"

namespace ddp {
namespace io {
namespace {

using ::ddp::testing::error_message_within;

std::string make_fifo(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
  return path;
}

TEST(RegularFile, OpensARegularFileWithItsSize) {
  const std::string dir = ::ddp::testing::fresh_scratch_dir("regular_file");
  std::ofstream(dir + "/f") << "12345";
  std::string why;
  const RegularFile file = RegularFile::open(dir + "/f", &why);
  ASSERT_TRUE(file.is_open()) << why;
  EXPECT_EQ(file.size(), 5u);
}

TEST(RegularFile, RefusesAFifoWithoutBlocking) {
  const std::string fifo = make_fifo(::ddp::testing::fresh_scratch_dir("regular_file_fifo"), "data.npy");
  const std::string message = error_message_within<InvalidArgument>(5, [&] {
    std::string why;
    if (!RegularFile::open(fifo, &why).is_open()) throw InvalidArgument(why);
  });
  EXPECT_NE(message.find("it is a FIFO (named pipe), not a regular file; give the path of a regular file"),
            std::string::npos) << message;
}

TEST(RegularFile, RefusesDirectoriesDevicesAndMissingFilesSayingWhich) {
  const std::string dir = ::ddp::testing::fresh_scratch_dir("regular_file_kinds");
  std::string why;
  EXPECT_FALSE(RegularFile::open(dir, &why).is_open());
  EXPECT_NE(why.find("it is a directory"), std::string::npos) << why;
  EXPECT_FALSE(RegularFile::open("/dev/null", &why).is_open());
  EXPECT_NE(why.find("it is a character device"), std::string::npos) << why;
  EXPECT_FALSE(RegularFile::open(dir + "/missing", &why).is_open());
  EXPECT_EQ(why, "cannot open: No such file or directory");
}

TEST(ReadFile, RefusesAFifoNamingItWithinABound) {
  const std::string fifo = make_fifo(::ddp::testing::fresh_scratch_dir("read_file_fifo"), "x");
  const std::string message = error_message_within<InvalidArgument>(5, [&] { read_file(fifo); });
  EXPECT_EQ(message.rfind(fifo + ": it is a FIFO (named pipe)", 0), 0u) << message;
}

TEST(LoadSafetensors, RefusesAFifoWithinABound) {
  const std::string fifo = make_fifo(::ddp::testing::fresh_scratch_dir("safetensors_fifo"), "test.safetensors");
  const std::string message = error_message_within<InvalidArgument>(5, [&] { load_safetensors(fifo); });
  EXPECT_NE(message.find("it is a FIFO (named pipe), not a regular file"), std::string::npos) << message;
}

TEST(SameFile, PathsThatNameOneExistingFileAreTheSame) {
  const std::string dir = ::ddp::testing::fresh_scratch_dir("same_file_existing");
  std::ofstream(dir + "/m.jsonl") << "x";
  ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((dir + "/m.jsonl").c_str(), (dir + "/link").c_str()), 0);
  ASSERT_EQ(::link((dir + "/m.jsonl").c_str(), (dir + "/hard").c_str()), 0);
  for (const char* alias : {"/./m.jsonl", "/sub/../m.jsonl", "/link", "/hard"}) {
    EXPECT_TRUE(same_file(dir + "/m.jsonl", dir + alias)) << alias;
  }
  std::ofstream(dir + "/other") << "x";
  EXPECT_FALSE(same_file(dir + "/m.jsonl", dir + "/other"));
}

TEST(SameFile, AFileNotYetWrittenIsItsDirectoryAndName) {
  const std::string dir = ::ddp::testing::fresh_scratch_dir("same_file_new");
  ASSERT_EQ(::mkdir((dir + "/out").c_str(), 0700), 0);
  ASSERT_EQ(::symlink((dir + "/out").c_str(), (dir + "/out_link").c_str()), 0);
  for (const char* alias : {"/out/./m.onnx", "/out_link/m.onnx", "/out//m.onnx"}) {
    EXPECT_TRUE(same_file(dir + "/out/m.onnx", dir + alias)) << alias;
  }
  EXPECT_FALSE(same_file(dir + "/out/m.onnx", dir + "/out/n.onnx"));
  // One exists, the other does not: never the same file.
  std::ofstream(dir + "/out/m.jsonl") << "x";
  EXPECT_FALSE(same_file(dir + "/out/m.jsonl", dir + "/out/m.onnx"));
  // No parent directory: names no file.
  EXPECT_FALSE(same_file(dir + "/nowhere/m", dir + "/nowhere/m"));
  EXPECT_FALSE(same_file("", ""));
}

}  // namespace
}  // namespace io
}  // namespace ddp
