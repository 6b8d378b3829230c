// Metrics as JSON lines: one JSON object per line, flushed as it is written.
//
// A line per record means a crash loses at most the record being written, `tail -f` and `jq` work on a live
// run, and a resumed run can append to the same file. Records are nlohmann::json objects (non-finite numbers
// become null, as JSON has no NaN).
#pragma once

#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace ddp {
namespace io {

class MetricsWriter {
 public:
  // Truncates `path`, or appends to it (a resumed run). Throws InvalidArgument naming the path when it cannot
  // be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Writes one record (it must be a JSON object) and flushes it; safe from several threads.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

}  // namespace io
}  // namespace ddp
