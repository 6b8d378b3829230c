// TensorBoard's record framing and Event protobufs (generated from tensorboard_event.proto by protoc).
#include "runtime/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "runtime/core/check.h"
#include "runtime/io/tensorboard_event.pb.h"

namespace ddp {
namespace io {
namespace {

// The reflected Castagnoli polynomial 0x1EDC6F41, one table lookup per byte: a few scalars per step need no
// faster (SSE4.2) path.
constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrc32cTable = make_crc32c_table();
static_assert(kCrc32cTable[1] == 0xf26b8303u, "CRC32C table: entry 1 of the reflected Castagnoli table");

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(const void* data, std::size_t bytes) {
  const std::uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& suffix) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw InvalidArgument("cannot create the TensorBoard directory " + dir + ": " + error.message() +
                          "; pass a directory that can be created and written");
  }
  const double now = unix_seconds();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host_name() + suffix))
              .string();
  // A new file: never append to, or truncate, another writer's.
  try {
    file_ = std::make_unique<RecordFile>(path_, RecordFile::Mode::kCreateNew, "TensorBoard events file");
  } catch (const InvalidArgument& e) {
    std::error_code ignored;
    if (!std::filesystem::exists(path_, ignored)) throw;
    throw InvalidArgument(std::string(e.what()) + "; another writer started in the same second in this directory: "
                          "give each writer its own directory or suffix");
  }
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_step(0);
  event.set_file_version("brain.Event:2");
  std::lock_guard<std::mutex> lock(mutex_);
  write_record(event.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() = default;

std::string TensorBoardWriter::failure() {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_->failure();
}

void TensorBoardWriter::scalar(const std::string& tag, double value, std::int64_t step) {
  scalars({{tag, value}}, step);
}

void TensorBoardWriter::scalars(const std::vector<std::pair<std::string, double>>& values, std::int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    DDP_CHECK(!tag.empty(), "a TensorBoard scalar needs a tag (written to " + path_ + ")");
    tensorboard::SummaryValue* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  std::string record;
  record.reserve(bytes.size() + 16);
  put_le(record, bytes.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += bytes;
  put_le(record, masked_crc32c(bytes.data(), bytes.size()), 4);
  file_->append(record.data(), record.size());
}

}  // namespace io
}  // namespace ddp
