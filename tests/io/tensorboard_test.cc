// TensorBoardWriter: the record framing and its checksums read back byte by byte, the events parsed with the
// same schema, and the file name TensorBoard looks for. tensorboard_events_test.py decodes the files
// independently, with a schema built at run time.
#include "runtime/io/tensorboard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/tensorboard_event.pb.h"
#include "tests/scratch.h"

namespace ddp::io {
namespace {

std::uint64_t get_le(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t value = 0;
  for (int i = 0; i < n; ++i) value |= std::uint64_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return value;
}

// Every record of the file, with both checksums verified.
std::vector<tensorboard::Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<tensorboard::Event> events;
  std::size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "truncated record header at " << at;
    const std::uint64_t length = get_le(bytes, at, 8);
    EXPECT_EQ(get_le(bytes, at + 8, 4), masked_crc32c(bytes.data() + at, 8)) << "length CRC at " << at;
    EXPECT_LE(at + 12 + length + 4, bytes.size()) << "truncated record at " << at;
    const std::string data = bytes.substr(at + 12, length);
    EXPECT_EQ(get_le(bytes, at + 12 + length, 4), masked_crc32c(data.data(), data.size())) << "data CRC at " << at;
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromString(data));
    events.push_back(event);
    at += 12 + length + 4;
  }
  return events;
}

TEST(TensorBoard, Crc32cIsCastagnolisOnTheStandardCheckString) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // 32 zero bytes: the iSCSI test vector (RFC 3720, B.4).
  const std::vector<unsigned char> zeros(32, 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  // Continuing from a partial CRC equals one pass over the whole.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xe3069283u);
}

TEST(TensorBoard, ScalarsReadBackWithTheirTagsStepsAndValuesAndEveryChecksumVerifies) {
  const std::string dir = testing::fresh_scratch_dir("tensorboard") + "/run/nested";
  std::string path;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    writer.scalar("train/loss", 2.5, 1);
    writer.scalar("train/loss", 1.25, 2);
    writer.scalars({{"test/loss", 0.75}, {"test/accuracy", 0.875}}, 2);
    // Flushed per write: the file is complete before the writer closes.
    EXPECT_EQ(read_events(path).size(), 4u);
  }
  const std::string name = std::filesystem::path(path).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(std::filesystem::path(path).parent_path().string(), dir);

  const std::vector<tensorboard::Event> events = read_events(path);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  EXPECT_EQ(events[1].step(), 1);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].step(), 2);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1.25f);
  ASSERT_EQ(events[3].summary().value_size(), 2);
  EXPECT_EQ(events[3].summary().value(1).tag(), "test/accuracy");
  EXPECT_EQ(events[3].summary().value(1).simple_value(), 0.875f);
  EXPECT_GE(events[3].wall_time(), events[0].wall_time());
}

// A full disk under the events file (a file size limit): one warning, the file cut back to its whole records, and
// no exception to end the run.
TEST(TensorBoard, AFailedWriteIsReportedOnceAndLeavesOnlyWholeRecords) {
  const std::string dir = testing::fresh_scratch_dir("tensorboard_full");
  std::string path, warnings;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    testing::FileSizeLimit limit(1000);  // above the warning's length: stderr's capture is a file too
    ::testing::internal::CaptureStderr();
    for (int step = 1; step <= 60; ++step) EXPECT_NO_THROW(writer.scalar("train/loss", 1.0 / step, step));
    warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(writer.failure(), "File too large");
  }
  EXPECT_LE(std::filesystem::file_size(path), 1000u);
  const std::vector<tensorboard::Event> events = read_events(path);  // checks that no record is cut short
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().step(), static_cast<std::int64_t>(events.size()) - 1);
  EXPECT_EQ(warnings.rfind("ddp: warning: writing TensorBoard events file " + path + " failed: File too large;", 0),
            0u) << warnings;
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 1) << warnings;
}

TEST(TensorBoard, ASecondWriterWithTheSameNameIsRefusedRatherThanOverwritingTheFirst) {
  const std::string dir = testing::fresh_scratch_dir("tensorboard_twice");
  TensorBoardWriter first(dir, ".rank0");
  try {
    // Same second (almost always); if the clock ticked in between, the names differ and both are fine.
    TensorBoardWriter second(dir, ".rank0");
    EXPECT_NE(second.path(), first.path());
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(first.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("suffix"), std::string::npos) << e.what();
  }
  TensorBoardWriter other(dir, ".rank1");
  EXPECT_NE(other.path(), first.path());
}

TEST(TensorBoard, ADirectoryThatCannotBeCreatedIsNamedInTheError) {
  const std::string file = testing::fresh_scratch_dir("tensorboard_bad") + "/a_file";
  std::ofstream(file) << "x";
  try {
    TensorBoardWriter writer(file + "/sub");
    FAIL() << "a directory under a file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::io
