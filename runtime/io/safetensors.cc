// safetensors writing (streamed, with checksums) and hostile-input-safe reading.
#include "runtime/io/safetensors.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/core/check.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this writer copies host bytes as they are"
#endif

namespace ddp {
namespace io {
namespace {

using nlohmann::json;

// product(shape) * element size, or false on a negative dimension or overflow past `limit`.
bool byte_count(const std::vector<int64_t>& shape, size_t element, size_t limit, size_t* out) {
  size_t n = element;
  for (int64_t d : shape) {
    if (d < 0) return false;
    const auto u = static_cast<uint64_t>(d);
    if (u != 0 && n > limit / u) return false;
    n *= static_cast<size_t>(u);
  }
  *out = n;
  return true;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Shapes as the header spells them: "[10,512]".
std::string shape_str_compact(const std::vector<int64_t>& shape) { return shape_str(shape, ","); }

}  // namespace

std::string crc32_hex(const void* data, size_t bytes) {
  const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(data), bytes);
  char text[9];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  return text;
}

std::string metadata_crc32(const std::map<std::string, std::string>& metadata) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (const auto& [key, value] : metadata) {
    if (starts_with(key, kCrc32KeyPrefix)) continue;
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(key.c_str()), key.size() + 1);
    crc = crc32_z(crc, reinterpret_cast<const Bytef*>(value.c_str()), value.size() + 1);
  }
  char text[9];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  return text;
}

namespace {

// The header text for `tensors` with the given checksums, padded so the data section starts 8-byte aligned (as
// safetensors' own writer does). Checksums are 8 hex digits, so the length does not depend on their values.
std::string header_text(const std::vector<TensorSource>& tensors, const std::vector<std::string>& crcs,
                        const json& user_metadata) {
  json header = json::object();
  json meta = user_metadata;
  meta[kMetadataCrc32Key] = metadata_crc32(user_metadata.get<std::map<std::string, std::string>>());
  size_t offset = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorSource& t = tensors[k];
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    meta[kCrc32KeyPrefix + t.name] = crcs[k];
    offset += t.bytes;
  }
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Appends a produced tensor's bytes, counting them and keeping their running CRC32.
void write_produced(const FileWriter& file, const TensorSource& t, std::string* crc) {
  uLong running = crc32_z(0L, Z_NULL, 0);
  size_t written = 0;
  t.produce([&](const void* data, size_t bytes) {
    written += bytes;
    if (written > t.bytes) {
      throw InvalidArgument("safetensors: tensor " + t.name + ": the producer wrote more than its " +
                            std::to_string(t.bytes) + " bytes");
    }
    running = crc32_z(running, static_cast<const Bytef*>(data), bytes);
    file.append(data, bytes);
  });
  if (written != t.bytes) {
    throw InvalidArgument("safetensors: tensor " + t.name + ": the producer wrote " + std::to_string(written) +
                          " bytes of " + std::to_string(t.bytes));
  }
  char text[9];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(running & 0xffffffffUL));
  *crc = text;
}

}  // namespace

void write_safetensors(const FileWriter& file, const std::vector<TensorSource>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json meta = json::object();
  for (const auto& [key, value] : metadata) {
    if (starts_with(key, kCrc32KeyPrefix)) {
      throw InvalidArgument("safetensors metadata key '" + key + "' uses the reserved prefix " + kCrc32KeyPrefix);
    }
    meta[key] = value;
  }
  std::set<std::string> names;
  std::vector<std::string> crcs;
  bool produced = false;
  for (const TensorSource& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      throw InvalidArgument("safetensors: invalid tensor name '" + t.name + "'");
    }
    if (!names.insert(t.name).second) throw InvalidArgument("safetensors: tensor " + t.name + " appears twice");
    size_t expected = 0;
    if (!byte_count(t.shape, dtype_size(t.dtype), std::numeric_limits<size_t>::max() / 2, &expected) ||
        expected != t.bytes) {
      throw InvalidArgument("safetensors: tensor " + t.name + ": " + std::to_string(t.bytes) +
                            " bytes given for shape " + shape_str_compact(t.shape) + " of " + safetensors_dtype_name(t.dtype));
    }
    const bool lazy = t.data == nullptr && t.bytes > 0;
    if (lazy && !t.produce) throw InvalidArgument("safetensors: tensor " + t.name + ": no data");
    produced = produced || lazy;
    crcs.push_back(lazy ? std::string(8, '0') : crc32_hex(t.data, t.bytes));  // a placeholder until produced
  }
  const std::string text = header_text(tensors, crcs, meta);
  uint8_t length[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(n >> (8 * i));
  file.append(length, sizeof length);
  file.append(text.data(), text.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorSource& t = tensors[k];
    if (t.data != nullptr) {
      if (t.bytes > 0) file.append(t.data, t.bytes);
    } else if (t.bytes > 0) {
      write_produced(file, t, &crcs[k]);
    }
  }
  if (!produced) return;
  const std::string final_text = header_text(tensors, crcs, meta);
  DDP_ASSERT(final_text.size() == text.size(), "the safetensors header changed length with its checksums");
  file.overwrite(sizeof length, final_text.data(), final_text.size());
}

std::string encode_safetensors(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::string out;
  write_safetensors(FileWriter{[&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); },
                               [&out](size_t offset, const void* p, size_t n) {
                                 out.replace(offset, n, static_cast<const char*>(p), n);
                               }},
                    tensors, metadata);
  return out;
}

void save_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomically_rewriting(path, [&](const FileWriter& file) { write_safetensors(file, tensors, metadata); });
}

namespace {

// Throws InvalidArgument("<kind> <source>: <what>"): every refusal of the reader names the file.
struct Refusal {
  std::string where;
  [[noreturn]] void operator()(const std::string& what) const { throw InvalidArgument(where + what); }
};

// The 8-byte length and the JSON header it announces; `data_start` is where the data section begins.
json read_header(const std::string& bytes, const ReadOptions& options, const Refusal& fail, size_t* data_start) {
  const size_t size = bytes.size();
  if (size < 8) fail("truncated: " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  if (header_len > options.max_header_bytes) {
    fail("header length " + std::to_string(header_len) + " exceeds the limit of " +
         std::to_string(options.max_header_bytes) + " bytes; the file is corrupt or not a safetensors file");
  }
  if (header_len > size - 8) {
    fail("truncated: header says " + std::to_string(header_len) + " bytes of header, file has " +
         std::to_string(size - 8) + " after the length");
  }
  *data_start = 8 + static_cast<size_t>(header_len);
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(*data_start));
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  return header;
}

std::map<std::string, std::string> parse_metadata(const json& value, const Refusal& fail) {
  if (!value.is_object()) fail("__metadata__ is not a JSON object");
  std::map<std::string, std::string> metadata;
  for (auto m = value.begin(); m != value.end(); ++m) {
    if (!m.value().is_string()) fail("__metadata__ value of '" + m.key() + "' is not a string");
    metadata[m.key()] = m.value().get<std::string>();
  }
  return metadata;
}

// One tensor's header entry: dtype, shape and offsets, each checked, and the shape's bytes against the offsets'.
TensorEntry parse_entry(const std::string& name, const json& value, const Refusal& fail) {
  const std::string tensor = "tensor " + name + ": ";
  if (!value.is_object()) fail(tensor + "header entry is not a JSON object");
  const auto dtype = value.find("dtype");
  const auto shape = value.find("shape");
  const auto offsets = value.find("data_offsets");
  if (dtype == value.end() || shape == value.end() || offsets == value.end()) {
    fail(tensor + "header entry needs dtype, shape and data_offsets");
  }
  TensorEntry entry;
  entry.name = name;
  if (!dtype->is_string() || !parse_safetensors_dtype(dtype->get<std::string>(), &entry.dtype)) {
    fail(tensor + "unknown dtype " + dtype->dump());
  }
  if (!shape->is_array() || shape->size() > 64) fail(tensor + "shape is not an array of at most 64 sizes");
  for (const json& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(tensor + "shape " + shape->dump() + " holds something other than a non-negative integer");
    }
    entry.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    fail(tensor + "data_offsets " + offsets->dump() + " is not a pair of non-negative integers");
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (begin > end) fail(tensor + "data_offsets " + offsets->dump() + " end before they begin");
  entry.begin = static_cast<size_t>(begin);
  entry.end = static_cast<size_t>(end);
  size_t expected = 0;
  if (!byte_count(entry.shape, dtype_size(entry.dtype), std::numeric_limits<size_t>::max() / 2, &expected) ||
      expected != entry.bytes()) {
    fail(tensor + "shape " + shape_str_compact(entry.shape) + " of " + safetensors_dtype_name(entry.dtype) +
         " does not fit its " + std::to_string(entry.bytes()) + " bytes of data");
  }
  return entry;
}

// The tensors must end inside the data section and tile it: a gap or an overlap means the header and the data
// disagree. Sorts `tensors` by offset.
void check_tiling(std::vector<TensorEntry>& tensors, size_t data_size, const Refusal& fail) {
  const TensorEntry* last = nullptr;
  for (const TensorEntry& t : tensors) {
    if (last == nullptr || t.end > last->end) last = &t;
  }
  if (last != nullptr && last->end > data_size) {
    fail("truncated: header says " + std::to_string(last->end) + " bytes of data, file has " +
         std::to_string(data_size) + " (tensor " + last->name + " lies past the end); the write was interrupted " +
         "or the file was cut short");
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  size_t covered = 0;
  for (const TensorEntry& t : tensors) {
    if (t.begin != covered) {
      fail("tensor " + t.name + ": data starts at byte " + std::to_string(t.begin) + " of the data section, " +
           (t.begin < covered ? "overlapping the tensor before it" : "leaving a gap after the tensor before it") +
           " (expected " + std::to_string(covered) + ")");
    }
    covered = t.end;
  }
  if (covered < data_size) {
    fail("wrong length: header says " + std::to_string(covered) + " bytes of data, file has " +
         std::to_string(data_size));
  }
}

// Each tensor's bytes against its stored CRC32 (required or not), and no checksum for a tensor the header lacks.
void check_checksums(const std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>& metadata,
                     const char* data, bool required, const Refusal& fail) {
  std::set<std::string> names;
  for (const TensorEntry& t : tensors) {
    names.insert(t.name);
    const auto crc = metadata.find(kCrc32KeyPrefix + t.name);
    if (crc == metadata.end()) {
      if (required) {
        fail("tensor " + t.name + ": no checksum (" + kCrc32KeyPrefix + t.name +
             ") in __metadata__; the file was not written by this runtime's checkpoint writer");
      }
      continue;
    }
    const std::string actual = crc32_hex(data + t.begin, t.bytes());
    if (crc->second != actual) {
      fail("tensor " + t.name + ": checksum mismatch (stored crc32 " + crc->second + ", data has " + actual +
           "): the file is corrupt; use an older checkpoint");
    }
  }
  const auto stored = metadata.find(kMetadataCrc32Key);
  if (stored != metadata.end()) {
    const std::string actual = metadata_crc32(metadata);
    if (stored->second != actual) {
      fail("__metadata__: checksum mismatch (stored crc32 " + stored->second + ", metadata has " + actual +
           "): a value in it (a step, an epoch, a position) is damaged; use an older checkpoint");
    }
  }
  for (const auto& [key, value] : metadata) {
    if (key == kMetadataCrc32Key) continue;
    if (starts_with(key, kCrc32KeyPrefix) && names.count(key.substr(std::strlen(kCrc32KeyPrefix))) == 0) {
      fail("__metadata__ has a checksum for tensor " + key.substr(std::strlen(kCrc32KeyPrefix)) +
           ", which the header does not list: the header is damaged");
    }
  }
}

}  // namespace

SafetensorsFile parse_safetensors(std::string bytes, const std::string& source, const ReadOptions& options) {
  const Refusal fail{options.kind + " " + source + ": "};
  size_t data_start = 0;
  const json header = read_header(bytes, options, fail, &data_start);
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      metadata = parse_metadata(it.value(), fail);
    } else {
      tensors.push_back(parse_entry(it.key(), it.value(), fail));
    }
  }
  check_tiling(tensors, bytes.size() - data_start, fail);
  check_checksums(tensors, metadata, bytes.data() + data_start, options.require_checksums, fail);

  SafetensorsFile file;
  file.source_ = source;
  file.kind_ = options.kind;
  for (size_t i = 0; i < tensors.size(); ++i) file.by_name_[tensors[i].name] = i;
  file.tensors_ = std::move(tensors);
  file.metadata_ = std::move(metadata);
  file.data_start_ = data_start;
  file.bytes_ = std::move(bytes);
  return file;
}

SafetensorsFile load_safetensors(const std::string& path, const ReadOptions& options) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(options.kind + " " + path + ": " + e.what());
  }
  return parse_safetensors(std::move(bytes), path, options);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  const TensorEntry* entry = find(name);
  if (entry == nullptr) {
    std::string held;
    for (size_t i = 0; i < tensors_.size() && i < 8; ++i) held += (i ? ", " : "") + tensors_[i].name;
    if (tensors_.size() > 8) held += ", ...";
    throw InvalidArgument(where() + "tensor " + name + ": missing from the file (it holds " +
                          std::to_string(tensors_.size()) + " tensors: " + held +
                          "); the checkpoint is from a different model");
  }
  return *entry;
}

const uint8_t* SafetensorsFile::data(const TensorEntry& entry) const {
  return reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ + entry.begin;
}

void SafetensorsFile::copy_to(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                              void* out) const {
  const TensorEntry& entry = at(name);
  if (entry.dtype != dtype) {
    throw InvalidArgument(where() + "tensor " + name + ": dtype " + safetensors_dtype_name(entry.dtype) +
                          " does not match the model's " + safetensors_dtype_name(dtype));
  }
  if (entry.shape != shape) {
    throw InvalidArgument(where() + "tensor " + name + ": shape " + shape_str_compact(entry.shape) +
                          " does not match the model's " + shape_str_compact(shape) +
                          "; the checkpoint is from a model of another size");
  }
  if (entry.bytes() > 0) std::memcpy(out, data(entry), entry.bytes());
}

}  // namespace io
}  // namespace ddp
