// JSON-lines writer: a mutex around fputs + fflush.
#include "runtime/io/metrics.h"

#include <cerrno>
#include <cstring>

#include "runtime/core/check.h"

namespace ddp {
namespace io {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr) {
    throw InvalidArgument("cannot open metrics file " + path + ": " + std::strerror(errno) +
                          "; check that its directory exists and is writable");
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  DDP_CHECK(record.is_object(), "a metrics record must be a JSON object, got " + record.dump());
  // Replace invalid UTF-8 instead of throwing halfway through a training run.
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    throw Error("writing metrics file " + path_ + " failed: " + std::strerror(errno));
  }
}

}  // namespace io
}  // namespace ddp
