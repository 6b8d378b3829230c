// libFuzzer target for the checkpoint reader: any bytes must either parse or raise InvalidArgument, never crash,
// hang or read out of bounds; and whatever parses must re-encode and parse back to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp::io;
  ReadOptions options;
  options.max_header_bytes = 1 << 20;
  try {
    const SafetensorsFile file = parse_safetensors(std::string(reinterpret_cast<const char*>(data), size), "fuzz",
                                                   options);
    std::vector<TensorSource> sources;
    for (const TensorEntry& t : file.tensors()) {
      std::vector<uint8_t> copy(t.bytes());
      file.copy_to(t.name, t.dtype, t.shape, copy.data());
      sources.push_back({t.name, t.dtype, t.shape, file.data(t), t.bytes()});
    }
    std::map<std::string, std::string> metadata;
    for (const auto& [key, value] : file.metadata()) {
      if (key.rfind(kCrc32KeyPrefix, 0) != 0) metadata[key] = value;
    }
    std::string again;
    try {
      again = encode_safetensors(sources, metadata);
    } catch (const ddp::InvalidArgument&) {
      return 0;  // e.g. a name the writer reserves; the reader may accept what the writer will not produce
    }
    ReadOptions strict = options;
    strict.require_checksums = true;
    strict.max_header_bytes = kMaxHeaderBytes;
    const SafetensorsFile back = parse_safetensors(again, "fuzz-again", strict);
    if (back.tensors().size() != file.tensors().size()) std::abort();
  } catch (const ddp::InvalidArgument&) {
  }
  return 0;
}
