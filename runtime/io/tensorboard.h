// TensorBoard event files written by the library: scalars a run can be watched with in TensorBoard, the tool most
// PyTorch users open first, without TensorFlow or Python in the training program.
//
// The format is TensorFlow's record file: each record is
//   uint64 length | uint32 masked CRC32C(length) | length bytes | uint32 masked CRC32C(bytes)
// (little endian; CRC32C is Castagnoli's polynomial; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), and each
// record holds one `Event` protobuf (runtime/io/tensorboard_event.proto: the published field numbers). The first
// event carries file_version "brain.Event:2". Every scalar is written straight to the file, so TensorBoard shows a
// live run and a crash loses at most the record being written; a write that fails (a full disk) leaves no half
// record: the file is reported once and takes no more events (record_file.h), and the run goes on.
//
//   io::TensorBoardWriter tb("runs/mnist");          // runs/mnist/events.out.tfevents.<unix time>.<host>
//   tb.scalar("train/loss", loss, step);
//   tb.scalars({{"test/loss", test_loss}, {"test/accuracy", accuracy}}, step);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/io/record_file.h"

namespace ddp {
namespace io {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if missing and a new events file in it named
  // events.out.tfevents.<unix seconds>.<hostname><suffix>; several writers in one directory (ranks, restarts in
  // the same second) need distinct suffixes. Throws InvalidArgument naming the file when it cannot be created.
  explicit TensorBoardWriter(const std::string& dir, const std::string& suffix = "");
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event with one scalar (stored as float, as TensorBoard's simple_value is), written. Safe from several
  // threads. After a failed write (reported once on stderr) events are dropped: see failure().
  void scalar(const std::string& tag, double value, std::int64_t step);
  // One event with several scalars of the same step, written.
  void scalars(const std::vector<std::pair<std::string, double>>& values, std::int64_t step);

  const std::string& path() const { return path_; }
  // Empty while events are written; else why the file stopped taking them.
  std::string failure();

 private:
  void write_record(const std::string& bytes);  // caller holds mutex_

  std::string path_;
  std::unique_ptr<RecordFile> file_;
  std::mutex mutex_;
};

// CRC32C (Castagnoli) of `bytes`, continuing from `crc` (0 to start): crc32c("123456789") = 0xe3069283.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);
// The masked form the record format stores, so that a CRC of data holding CRCs stays well distributed.
std::uint32_t masked_crc32c(const void* data, std::size_t bytes);

}  // namespace io
}  // namespace ddp
