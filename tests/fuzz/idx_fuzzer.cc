// libFuzzer target for the IDX reader: raw IDX bytes and gzip streams must parse or raise InvalidArgument.
#include <cstddef>
#include <cstdint>

#include "runtime/core/check.h"
#include "runtime/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp::data;
  try {
    const IdxArray a = parse_idx(data, size, "fuzz");
    make_image_dataset(a, "fuzz-images", IdxArray{{a.dims[0]}, std::vector<uint8_t>(a.dims[0], 1)}, "fuzz-labels",
                       10, 0.5f, 0.25f);
  } catch (const ddp::InvalidArgument&) {
  }
  try {
    // A small output cap keeps each run fast; the cap's own check is part of what is fuzzed.
    const std::vector<uint8_t> raw = gunzip(data, size, "fuzz.gz", size_t{1} << 22);
    parse_idx(raw.data(), raw.size(), "fuzz.gz");
  } catch (const ddp::InvalidArgument&) {
  }
  return 0;
}
