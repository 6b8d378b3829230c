// Metrics as JSON lines: one JSON object per line, flushed as it is written.
//
// A line per record means a crash loses at most the record being written, `tail -f` and `jq` work on a live
// run, and a resumed run can append to the same file. Records are nlohmann::json objects (non-finite numbers
// become null, as JSON has no NaN). A write that fails (a full disk) neither ends the run nor leaves half a line:
// the file is reported once and takes no more records (record_file.h).
#pragma once

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>


namespace ddp {
namespace io {

class RecordFile;  // runtime/io/record_file.h

class MetricsWriter {
 public:
  // Truncates `path`, or appends to it (a resumed run). Throws InvalidArgument naming the path when it cannot
  // be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Writes one record (it must be a JSON object) straight to the file; safe from several threads. After a
  // failed write (reported once on stderr) records are dropped: see failure().
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }
  // Empty while records are written; else why the file stopped taking them.
  std::string failure();

 private:
  std::string path_;
  std::unique_ptr<RecordFile> file_;
  std::mutex mutex_;
};

}  // namespace io
}  // namespace ddp
