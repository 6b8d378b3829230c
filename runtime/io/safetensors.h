// safetensors files: the checkpoint format PyTorch (safetensors.torch.load_file) reads directly.
//
// Layout: 8 bytes little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
// then the data section, each tensor's raw little-endian bytes at [begin, end) of it.
//
// Tensors are plain named host buffers here, so this layer needs nothing of the tensor library. The writer adds
// a CRC32 (zlib) of every tensor's bytes to __metadata__ as "ddp.crc32:NAME" (8 hex digits), which the reader
// verifies. The reader treats its input as hostile (a fuzzer drives parse_safetensors): the header size is
// capped, every offset and shape is checked against the file, the tensors must tile the data section exactly,
// and each refusal names the file and the tensor and says what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/io/atomic_file.h"

namespace ddp {
namespace io {

// A tensor to write: `bytes` must equal product(shape) * dtype_size(dtype). Its bytes are `data`, or, when
// `data` is null, whatever `produce` appends to the sink it is given while the file is written (exactly `bytes`
// of them: a tensor copied from a device or gathered from other processes one at a time, so that no process
// holds the whole file's contents); a produced tensor's checksum is computed on the way and the header, written
// first, is rewritten at the end.
struct TensorSource {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  std::function<void(const ByteSink&)> produce;
};

// Metadata key prefix of the per-tensor checksums (reserved: user metadata may not use it).
constexpr const char* kCrc32KeyPrefix = "ddp.crc32:";
// The checksum of the metadata itself (every key and value but the checksums, see metadata_crc32): a flipped
// bit in a step count is found as a flipped bit in a tensor is. Written into every file; checked when present.
constexpr const char* kMetadataCrc32Key = "ddp.crc32:__metadata__";
// CRC32 (8 hex digits) of `metadata`'s keys and values in key order, each followed by a NUL byte, leaving out
// the checksum keys (kCrc32KeyPrefix).
std::string metadata_crc32(const std::map<std::string, std::string>& metadata);
// Largest header accepted (safetensors' own limit).
constexpr size_t kMaxHeaderBytes = size_t{100} << 20;

// Streams a whole file to `file`. Throws InvalidArgument for an empty, duplicate or reserved ("__metadata__")
// name, a byte count that does not match the shape, a tensor with neither data nor producer, a producer that
// appends another number of bytes, or metadata using the reserved checksum prefix.
void write_safetensors(const FileWriter& file, const std::vector<TensorSource>& tensors,
                       const std::map<std::string, std::string>& metadata);
// The same into a string (tests, small files).
std::string encode_safetensors(const std::vector<TensorSource>& tensors,
                               const std::map<std::string, std::string>& metadata);
// Atomically writes `path` (see atomic_file.h).
void save_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                      const std::map<std::string, std::string>& metadata);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  size_t begin = 0;  // offsets into the data section
  size_t end = 0;
  size_t bytes() const { return end - begin; }
};

struct ReadOptions {
  // Refuse tensors without a checksum (checkpoints do; a file from PyTorch has none).
  bool require_checksums = false;
  // How errors name the file: "checkpoint /x/ckpt-00000100.safetensors: ...".
  std::string kind = "safetensors file";
  size_t max_header_bytes = kMaxHeaderBytes;
};

class SafetensorsFile {
 public:
  const std::string& source() const { return source_; }
  // In data-section order.
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorEntry* find(const std::string& name) const;
  // Throws InvalidArgument naming the file and the tensor when absent.
  const TensorEntry& at(const std::string& name) const;
  const uint8_t* data(const TensorEntry& entry) const;
  // Copies a tensor into `out` (exactly product(shape) * dtype_size bytes) after checking that it exists and
  // has the dtype and shape the caller (the model) expects; each mismatch is an InvalidArgument such as
  // "checkpoint F: tensor 2.weight: shape [10,1024] does not match the model's [10,512]".
  void copy_to(const std::string& name, DType dtype, const std::vector<int64_t>& shape, void* out) const;
  // "KIND SOURCE: " prefix for the caller's own refusals.
  std::string where() const { return kind_ + " " + source_ + ": "; }

 private:
  friend SafetensorsFile parse_safetensors(std::string bytes, const std::string& source,
                                           const ReadOptions& options);
  std::string source_;
  std::string kind_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Validates and indexes a whole file held in memory; throws InvalidArgument on anything malformed.
SafetensorsFile parse_safetensors(std::string bytes, const std::string& source, const ReadOptions& options = {});
SafetensorsFile load_safetensors(const std::string& path, const ReadOptions& options = {});

// zlib's CRC32 of a buffer, as 8 lowercase hex digits.
std::string crc32_hex(const void* data, size_t bytes);

}  // namespace io
}  // namespace ddp
