// An output file of whole records (the metrics' JSON lines, TensorBoard's events) that a failed write cannot end
// a run with, nor leave half a record in. A run's outputs are a view of the training, not the training: when the
// disk fills under one, the file is cut back to its last whole record, the failure is reported once, and the file
// takes no more records, while training and its checkpoints go on.
#pragma once

#include <cstddef>
#include <string>

namespace ddp {
namespace io {

class RecordFile {
 public:
  enum class Mode { kTruncate, kAppend, kCreateNew };
  // Opens `path` (a FIFO without a reader fails at once instead of blocking). Throws InvalidArgument naming
  // `what` and the path when it cannot be opened: "cannot open metrics file P: why; ...".
  RecordFile(const std::string& path, Mode mode, const std::string& what);
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  // Appends one record whole, or nothing: on a failed or short write the file is cut back to where the record
  // began, one line "ddp: warning: writing WHAT P failed: why; ..." goes to stderr, and every later append
  // does nothing. Returns whether the record was written. The caller serialises calls.
  bool append(const void* data, std::size_t bytes);

  const std::string& path() const { return path_; }
  // Empty while the file takes records; else why it stopped ("No space left on device").
  const std::string& failure() const { return failure_; }

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
  std::string failure_;
};

}  // namespace io
}  // namespace ddp
