// IDX parsing with every length checked, gzip through libdeflate (a well-formed file, in one call) or zlib
// (streaming, and every diagnosis of a bad one), and the Fashion-MNIST split loader.
#include "runtime/data/idx.h"

#include <libdeflate.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>

#include "runtime/core/check.h"
#include "runtime/io/file_identity.h"

namespace ddp {
namespace data {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;
constexpr int kMaxDims = 8;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw InvalidArgument("IDX file " + source + ": " + what);
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string dims_text(const std::vector<uint32_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? "," : "") << dims[i];
  out << "]";
  return out.str();
}

// The header's dimensions and the size of the array they describe.
struct IdxHeader {
  std::vector<uint32_t> dims;
  size_t bytes = 0;       // the header's own length: 4 + 4 * dims
  uint64_t elements = 1;  // the array's, one byte each
};

// The header's length, from its 4-byte magic number (refused unless it says unsigned bytes in 1..8 dimensions).
size_t idx_header_bytes(const uint8_t* magic, const std::string& source) {
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByte || magic[3] == 0 || magic[3] > kMaxDims) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", big_endian_u32(magic));
    fail(source, std::string("bad magic number ") + text +
                     " (expected 0x000008NN: unsigned bytes in NN = 1.." + std::to_string(kMaxDims) +
                     " dimensions); the file is not an IDX file of unsigned bytes");
  }
  return 4 + 4 * size_t{magic[3]};
}

// Parses the header from the first `size` bytes of a file (at least 4: the magic number).
IdxHeader parse_idx_header(const uint8_t* bytes, size_t size, const std::string& source) {
  IdxHeader header;
  header.bytes = idx_header_bytes(bytes, source);
  if (size < header.bytes) {
    fail(source, "truncated: the header needs " + std::to_string(header.bytes) + " bytes for " +
                     std::to_string(bytes[3]) + " dimensions, file has " + std::to_string(size));
  }
  for (size_t i = 0; i < bytes[3]; ++i) {
    const uint32_t d = big_endian_u32(bytes + 4 + 4 * i);
    header.dims.push_back(d);
    if (d == 0) fail(source, "dimension " + std::to_string(i) + " is zero");
    // Each factor is below 2^32, so checking against the cap before every multiplication keeps it exact.
    if (header.elements > kMaxIdxBytes / d) {
      fail(source, "dimensions " + dims_text(header.dims) + " describe more than " + std::to_string(kMaxIdxBytes) +
                       " bytes; the header is corrupt");
    }
    header.elements *= d;
  }
  return header;
}

[[noreturn]] void fail_length(const std::string& source, const IdxHeader& header, uint64_t size) {
  const uint64_t expected = header.bytes + header.elements;
  fail(source, std::string(size < expected ? "truncated" : "wrong length") + ": dimensions " +
                   dims_text(header.dims) + " need " + std::to_string(expected) + " bytes, file has " +
                   std::to_string(size));
}

// Reads up to `size` decompressed bytes into `out`; fewer only at the end of the data.
size_t read_gzip(gzFile file, uint8_t* out, size_t size, const std::string& source) {
  size_t done = 0;
  while (done < size) {
    const unsigned want = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 30));
    const int n = gzread(file, out + done, want);
    int code = Z_OK;
    const char* message = gzerror(file, &code);
    if (n < 0 || (code != Z_OK && code != Z_STREAM_END)) {
      fail(source, std::string(code == Z_BUF_ERROR ? "truncated gzip data: " : "corrupt gzip data: ") +
                       (message ? message : "zlib error"));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// The file's decompressed bytes after the first `read`, counted (bounded by the cap) and dropped.
uint64_t count_rest(gzFile file, uint64_t read, const std::string& source) {
  std::vector<uint8_t> chunk(1 << 16);
  for (;;) {
    const size_t n = read_gzip(file, chunk.data(), chunk.size(), source);
    read += n;
    if (n < chunk.size() || read > kMaxIdxBytes) return read;
  }
}

// Closes a gzFile however the read ends.
struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};

}  // namespace

IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& source) {
  if (size < 4) fail(source, "file is " + std::to_string(size) + " bytes, too short for the 4-byte IDX magic number");
  const IdxHeader header = parse_idx_header(bytes, size, source);
  if (size != header.bytes + header.elements) fail_length(source, header, size);
  return IdxArray{header.dims, std::vector<uint8_t>(bytes + header.bytes, bytes + size)};
}

std::vector<uint8_t> gunzip(const uint8_t* bytes, size_t size, const std::string& source, size_t max_bytes) {
  z_stream stream;
  std::memset(&stream, 0, sizeof stream);
  // 16 + MAX_WBITS: expect a gzip header and trailer (the trailer's CRC catches corruption).
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) fail(source, "zlib inflateInit2 failed");
  std::vector<uint8_t> out;
  uint8_t chunk[1 << 16];
  stream.next_in = const_cast<Bytef*>(bytes);
  int status = Z_OK;
  size_t consumed = 0;
  while (status != Z_STREAM_END) {
    if (stream.avail_in == 0) {
      const size_t take = std::min<size_t>(size - consumed, std::numeric_limits<uInt>::max());
      if (take == 0) break;
      stream.next_in = const_cast<Bytef*>(bytes + consumed);
      stream.avail_in = static_cast<uInt>(take);
      consumed += take;
    }
    stream.next_out = chunk;
    stream.avail_out = sizeof chunk;
    status = inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      const std::string why = stream.msg ? stream.msg : ("zlib status " + std::to_string(status));
      inflateEnd(&stream);
      fail(source, "corrupt gzip data: " + why);
    }
    const size_t produced = sizeof chunk - stream.avail_out;
    if (out.size() + produced > max_bytes) {
      inflateEnd(&stream);
      fail(source, "decompresses to more than " + std::to_string(max_bytes) + " bytes");
    }
    out.insert(out.end(), chunk, chunk + produced);
  }
  inflateEnd(&stream);
  if (status != Z_STREAM_END) fail(source, "truncated gzip data: the stream ends before its trailer");
  return out;
}

namespace {

struct DecompressorFree {
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};

// The fast path of read_idx: a file of one gzip member whose trailer's size matches its IDX header, inflated by
// libdeflate in one call into one allocation (about twice zlib's speed: the training images' inflate was most of
// a training run's start-up). Anything else (no gzip magic, several members, a size that does not match, a corrupt
// or truncated stream) returns nothing, and the streaming zlib path reads the file and says what is wrong.
std::optional<IdxArray> read_single_member_gzip(const std::string& path, const io::RegularFile& file,
                                                const std::function<void(const IdxHeader&)>& on_header) {
  constexpr uint64_t kGzipOverhead = 18;  // the smallest gzip header and its 8-byte trailer
  if (file.size() < kGzipOverhead) return std::nullopt;
  std::vector<uint8_t> packed(static_cast<size_t>(file.size()));
  size_t read = 0;
  while (read < packed.size()) {
    const ssize_t n = ::pread(file.fd(), packed.data() + read, packed.size() - read, static_cast<off_t>(read));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    read += static_cast<size_t>(n);
  }
  if (packed[0] != 0x1f || packed[1] != 0x8b) return std::nullopt;
  const uint8_t* trailer = packed.data() + packed.size() - 4;  // ISIZE: the inflated size mod 2^32, little-endian
  const uint64_t inflated = uint64_t{trailer[0]} | (uint64_t{trailer[1]} << 8) | (uint64_t{trailer[2]} << 16) |
                            (uint64_t{trailer[3]} << 24);
  // The header first (a few bytes through zlib), so that `on_header` can start its work before the inflate.
  uint8_t head[4 + 4 * kMaxDims];
  z_stream stream;
  std::memset(&stream, 0, sizeof stream);
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK) return std::nullopt;
  stream.next_in = packed.data();
  stream.avail_in = static_cast<uInt>(std::min<size_t>(packed.size(), std::numeric_limits<uInt>::max()));
  stream.next_out = head;
  stream.avail_out = sizeof head;
  const int status = inflate(&stream, Z_SYNC_FLUSH);
  const size_t head_size = sizeof head - stream.avail_out;
  inflateEnd(&stream);
  if ((status != Z_OK && status != Z_STREAM_END) || head_size < 4) return std::nullopt;
  // A bad header is refused here as the streaming path would refuse it (the same checks, the same message).
  const IdxHeader header = parse_idx_header(head, head_size, path);
  if (header.bytes + header.elements != inflated) return std::nullopt;  // includes sizes of 4 GiB and more

  std::vector<uint8_t> raw(static_cast<size_t>(inflated));
  std::unique_ptr<libdeflate_decompressor, DecompressorFree> decompressor(libdeflate_alloc_decompressor());
  if (decompressor == nullptr) return std::nullopt;
  if (on_header) on_header(header);
  size_t used = 0, produced = 0;
  const libdeflate_result result = libdeflate_gzip_decompress_ex(decompressor.get(), packed.data(), packed.size(),
                                                                 raw.data(), raw.size(), &used, &produced);
  if (result != LIBDEFLATE_SUCCESS || used != packed.size() || produced != raw.size()) return std::nullopt;
  raw.erase(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(header.bytes));
  return IdxArray{header.dims, std::move(raw)};
}

// read_idx_file, telling `on_header` the array's shape before its bytes are read (and inflated).
IdxArray read_idx(const std::string& path, const std::function<void(const IdxHeader&)>& on_header) {
  std::string why;
  const io::RegularFile regular = io::RegularFile::open(path, &why);
  if (!regular.is_open()) fail(path, why);
  // `on_header` once, whichever path tells it first.
  bool told = false;
  auto tell = [&](const IdxHeader& header) {
    if (told || !on_header) return;
    told = true;
    on_header(header);
  };
  if (std::optional<IdxArray> array = read_single_member_gzip(path, regular, tell)) return std::move(*array);
  // zlib reads from its own descriptor (it closes it), at the start of the file that was checked.
  const int fd = ::dup(regular.fd());
  if (fd >= 0) ::lseek(fd, 0, SEEK_SET);
  std::unique_ptr<gzFile_s, GzCloser> file(fd >= 0 ? gzdopen(fd, "rb") : nullptr);
  if (file == nullptr && fd >= 0) ::close(fd);
  if (file == nullptr) fail(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(file.get(), 1 << 18);
  // The header first, then the array straight into its one allocation: the training images are 47 MB, and
  // growing a buffer and copying it again would cost more than decompressing them.
  uint8_t header_bytes[4 + 4 * kMaxDims];
  size_t got = read_gzip(file.get(), header_bytes, 4, path);
  if (got < 4) fail(path, "file is " + std::to_string(got) + " bytes, too short for the 4-byte IDX magic number");
  const size_t header_size = idx_header_bytes(header_bytes, path);
  got += read_gzip(file.get(), header_bytes + 4, header_size - 4, path);
  const IdxHeader header = parse_idx_header(header_bytes, got, path);
  tell(header);
  IdxArray array{header.dims, std::vector<uint8_t>(header.elements)};
  got += read_gzip(file.get(), array.values.data(), array.values.size(), path);
  if (got < header.bytes + header.elements) fail_length(path, header, got);
  const uint64_t size = count_rest(file.get(), got, path);
  if (size != got) fail_length(path, header, size);
  return array;
}

}  // namespace

IdxArray read_idx_file(const std::string& path) { return read_idx(path, nullptr); }

std::string fashion_mnist_images_file(Split split) {
  return split == Split::kTrain ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz";
}

std::string fashion_mnist_labels_file(Split split) {
  return split == Split::kTrain ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz";
}

namespace {

// make_image_dataset, the features written into `features` (already the images' size when a caller zeroed it
// ahead, or empty).
Dataset image_dataset(const IdxArray& images, const std::string& images_source, const IdxArray& labels,
                      const std::string& labels_source, int num_classes, float mean, float std_dev,
                      std::vector<float> features) {
  DDP_CHECK(num_classes > 0 && num_classes <= 256, "num_classes must be in 1..256");
  DDP_CHECK(std_dev > 0.0f, "std_dev must be positive");
  if (images.dims.size() < 2) {
    fail(images_source, "expected an images array [N, rows, cols], got dimensions " + dims_text(images.dims));
  }
  if (labels.dims.size() != 1) {
    fail(labels_source, "expected a labels array [N], got dimensions " + dims_text(labels.dims));
  }
  if (images.dims[0] != labels.dims[0]) {
    throw InvalidArgument("IDX files " + images_source + " and " + labels_source + " disagree: " +
                          std::to_string(images.dims[0]) + " images but " + std::to_string(labels.dims[0]) +
                          " labels; the two files come from different splits or downloads");
  }
  Dataset d;
  d.size = images.count();
  d.feature_count = static_cast<int64_t>(images.values.size()) / d.size;
  d.num_classes = num_classes;
  d.labels.resize(static_cast<size_t>(d.size));
  for (int64_t i = 0; i < d.size; ++i) {
    const int label = labels.values[static_cast<size_t>(i)];
    if (label >= num_classes) {
      fail(labels_source, "label " + std::to_string(label) + " of sample " + std::to_string(i) +
                              " is outside [0, " + std::to_string(num_classes) + ")");
    }
    d.labels[static_cast<size_t>(i)] = label;
  }
  // A 256-entry table gives every rank bit-identical features, computed once.
  float table[256];
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0f - mean) / std_dev;
  d.features = std::move(features);
  const size_t n = images.values.size();
  d.features.resize(n);
  // In four slices at once for a large set (the training images' 47 M values were a fifth of a training run's
  // start-up on one thread); each value is the table's either way.
  const uint8_t* in = images.values.data();
  float* out = d.features.data();
  auto convert = [&table, in, out](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = table[in[i]];
  };
  const size_t slices = n >= (size_t{1} << 22) ? 4 : 1;
  std::vector<std::future<void>> others;
  for (size_t s = 1; s < slices; ++s) {
    others.push_back(std::async(std::launch::async, convert, s * n / slices, (s + 1) * n / slices));
  }
  convert(0, n / slices);
  for (std::future<void>& f : others) f.get();
  return d;
}

}  // namespace

Dataset make_image_dataset(const IdxArray& images, const std::string& images_source, const IdxArray& labels,
                           const std::string& labels_source, int num_classes, float mean, float std_dev) {
  return image_dataset(images, images_source, labels, labels_source, num_classes, mean, std_dev, {});
}

Dataset load_fashion_mnist(const std::string& dir, Split split) {
  const std::string hint =
      "; install the data set (apt-get install dataset-fashion-mnist, which fills " +
      std::string(kDefaultFashionMnistDir) + ") or name a directory with the four " +
      "Fashion-MNIST .gz files";
  const std::string images_path = dir + "/" + fashion_mnist_images_file(split);
  const std::string labels_path = dir + "/" + fashion_mnist_labels_file(split);
  try {
    // The features (188 MB of floats for the training set) are zeroed, their pages touched for the first time,
    // on a thread of their own while the images inflate, which takes about as long: one after the other they
    // were most of the job's start-up. `zeroing` goes first, waiting for the thread, whatever is thrown.
    std::vector<float> features;
    std::future<void> zeroing;
    const IdxArray images = read_idx(images_path, [&](const IdxHeader& header) {
      zeroing = std::async(std::launch::async, [&features, n = header.elements] { features.resize(n); });
    });
    const IdxArray labels = read_idx_file(labels_path);
    if (zeroing.valid()) zeroing.get();
    if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
      fail(images_path, "expected Fashion-MNIST images [N, 28, 28], got dimensions " + dims_text(images.dims));
    }
    Dataset d = image_dataset(images, images_path, labels, labels_path, kFashionMnistClasses, kFashionMnistMean,
                              kFashionMnistStd, std::move(features));
    d.files = {images_path, labels_path};
    return d;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(e.what() + hint);
  }
}

}  // namespace data
}  // namespace ddp
