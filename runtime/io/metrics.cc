// JSON-lines writer: a mutex around a RecordFile.
#include "runtime/io/metrics.h"

#include "runtime/core/check.h"
#include "runtime/io/record_file.h"

namespace ddp {
namespace io {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path),
      file_(std::make_unique<RecordFile>(path, append ? RecordFile::Mode::kAppend : RecordFile::Mode::kTruncate,
                                         "metrics file")) {}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const nlohmann::json& record) {
  DDP_CHECK(record.is_object(), "a metrics record must be a JSON object, got " + record.dump());
  // Replace invalid UTF-8 instead of throwing halfway through a training run.
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  file_->append(line.data(), line.size());
}

std::string MetricsWriter::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_->failure();
}

}  // namespace io
}  // namespace ddp
