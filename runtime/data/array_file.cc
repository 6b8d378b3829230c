// .npy and safetensors data sets (see array_file.h).
#include "runtime/data/array_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <new>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/file_identity.h"
#include "runtime/io/safetensors.h"

namespace ddp {
namespace data {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicBytes = 6;

// NumPy's type strings this reader takes, little-endian ('<') or byte-sized ('|').
bool parse_npy_descr(const std::string& descr, DType* dtype) {
  static const std::pair<const char*, DType> kKnown[] = {
      {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<i4", DType::kInt32}, {"<i8", DType::kInt64},
      {"<i2", DType::kInt16},   {"|i1", DType::kInt8},    {"|u1", DType::kUInt8}, {"|b1", DType::kBool}};
  for (const auto& [name, type] : kKnown) {
    if (descr == name) {
      *dtype = type;
      return true;
    }
  }
  return false;
}

const char* npy_descr(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kInt16:
      return "<i2";
    case DType::kInt8:
      return "|i1";
    case DType::kUInt8:
      return "|u1";
    default:
      throw InvalidArgument(std::string("write_npy: dtype ") + dtype_name(dtype) + " is not written");
  }
}

// NumPy's header: a Python dict literal ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }") read as
// numpy.lib.format reads it (ast.literal_eval, then exactly the keys descr, fortran_order and shape at the top
// level): a key nested in another value, an extra key or a value of the wrong kind is refused, not guessed at.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen[3] = {false, false, false};
    static const char* const kKeys[3] = {"descr", "fortran_order", "shape"};
    skip_space();
    expect('{');
    skip_space();
    while (peek() != '}') {
      const std::string key = string_literal("a key");
      int which = -1;
      for (int k = 0; k < 3; ++k) {
        if (key == kKeys[k]) which = k;
      }
      if (which < 0) fail("it has the key '" + key + "'; numpy's header has only 'descr', 'fortran_order' and 'shape'");
      if (seen[which]) fail("the key '" + key + "' is given twice");
      seen[which] = true;
      skip_space();
      expect(':');
      skip_space();
      if (which == 0) header.descr = string_literal("the value of 'descr' (a dtype string such as '<f4')");
      if (which == 1) header.fortran_order = boolean("the value of 'fortran_order'");
      if (which == 2) header.shape = tuple_of_sizes();
      skip_space();
      if (peek() != ',') break;
      ++at_;
      skip_space();
    }
    expect('}');
    skip_space();
    if (at_ != text_.size()) fail("it goes on after the dictionary's closing '}'");
    for (int k = 0; k < 3; ++k) {
      if (!seen[k]) fail(std::string("it has no key '") + kKeys[k] + "'");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw InvalidArgument(source_ + ": the .npy header is not a dictionary as numpy writes it (" + why +
                          "); save the array with numpy.save");
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && std::strchr(" \t\n\r", text_[at_]) != nullptr && text_[at_] != '\0') ++at_;
  }
  void expect(char c) {
    if (peek() != c) {
      fail(std::string("expected '") + c + "' at byte " + std::to_string(at_) + " of the header, found " +
           (at_ < text_.size() ? "'" + std::string(1, text_[at_]) + "'" : "its end"));
    }
    ++at_;
  }
  std::string string_literal(const std::string& what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(what + " is not a quoted string at byte " + std::to_string(at_));
    const std::size_t end = text_.find(quote, at_ + 1);
    if (end == std::string::npos) fail("a string is not closed");
    std::string value = text_.substr(at_ + 1, end - at_ - 1);
    if (value.find('\\') != std::string::npos) fail(what + " has an escape sequence");
    at_ = end + 1;
    return value;
  }
  bool boolean(const std::string& what) {
    for (const char* word : {"True", "False"}) {
      const std::size_t n = std::strlen(word);
      const char next = at_ + n < text_.size() ? text_[at_ + n] : ' ';
      if (text_.compare(at_, n, word) == 0 && !std::isalnum(static_cast<unsigned char>(next))) {
        at_ += n;
        return word[0] == 'T';
      }
    }
    fail(what + " is not True or False");
  }
  // "(3, 4)", "(3,)", "()": Python's tuples; "(3)" is the number 3, which numpy refuses as a shape.
  std::vector<int64_t> tuple_of_sizes() {
    const std::string bad = "the value of 'shape' is not a tuple of sizes such as (3, 4) or (3,)";
    if (peek() != '(') fail(bad);
    ++at_;
    std::vector<int64_t> shape;
    bool trailing_comma = false;
    skip_space();
    while (peek() != ')') {
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail(bad);
      std::size_t used = 0;
      long long d = -1;
      try {
        d = std::stoll(text_.substr(at_, 20), &used);
      } catch (const std::exception&) {
        fail(bad);
      }
      shape.push_back(d);
      at_ += used;
      skip_space();
      trailing_comma = peek() == ',';
      if (!trailing_comma) break;
      ++at_;
      skip_space();
    }
    if (peek() != ')') fail(bad);
    ++at_;
    if (shape.size() == 1 && !trailing_comma) fail(bad);
    return shape;
  }

  const std::string& text_;
  const std::string& source_;
  std::size_t at_ = 0;
};

int64_t checked_count(const std::vector<int64_t>& shape, std::size_t element_bytes, const std::string& source) {
  uint64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > kMaxArrayBytes / element_bytes / static_cast<uint64_t>(d)) {
      throw InvalidArgument(source + ": the array's shape " + shape_str(shape) + " is larger than " +
                            std::to_string(kMaxArrayBytes >> 30) + " GiB");
    }
    count *= static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(count);
}

bool is_directory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_integer(DType d) {
  return d == DType::kInt32 || d == DType::kInt64 || d == DType::kInt16 || d == DType::kInt8 || d == DType::kUInt8;
}

// A value of type T stored at p, unaligned as it may be in a file's bytes, as a double.
template <typename T>
double load_as_double(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

// Element i of an array as a double (any dtype this file reads).
double element(const HostArray& a, int64_t i) {
  const uint8_t* p = a.bytes.data() + static_cast<std::size_t>(i) * dtype_size(a.dtype);
  switch (a.dtype) {
    case DType::kFloat32:
      return load_as_double<float>(p);
    case DType::kFloat64:
      return load_as_double<double>(p);
    case DType::kInt32:
      return load_as_double<int32_t>(p);
    case DType::kInt64:
      return load_as_double<int64_t>(p);
    case DType::kInt16:
      return load_as_double<int16_t>(p);
    case DType::kInt8:
      return load_as_double<int8_t>(p);
    case DType::kUInt8:
      return load_as_double<uint8_t>(p);
    default:
      break;
  }
  throw InvalidArgument(std::string("unsupported dtype ") + dtype_name(a.dtype));
}

// The array's values as float32, refusing integers where floats are wanted only by the caller.
std::vector<float> as_floats(const HostArray& a, const std::string& what) {
  std::vector<float> out(static_cast<std::size_t>(a.count()));
  const int64_t columns = a.shape.size() == 2 ? a.shape[1] : 1;
  for (int64_t i = 0; i < a.count(); ++i) {
    const double v = element(a, i);
    if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) {
      // Where a person looks for it: the row (a sample) and, in a table, the column (a feature).
      const std::string where = "row " + std::to_string(i / columns) +
                                (a.shape.size() == 2 ? ", column " + std::to_string(i % columns) : "");
      throw InvalidArgument(what + ": " + where + " is " + std::to_string(v) +
                            ", not a finite float32; clean the data first");
    }
    out[static_cast<std::size_t>(i)] = static_cast<float>(v);
  }
  return out;
}

HostArray safetensors_array(const io::SafetensorsFile& file, const std::string& name) {
  const io::TensorEntry& entry = file.at(name);
  HostArray a;
  a.dtype = entry.dtype;
  a.shape = entry.shape;
  const uint8_t* data = file.data(entry);
  a.bytes.assign(data, data + entry.bytes());
  return a;
}

}  // namespace

int64_t HostArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostArray parse_npy(const uint8_t* bytes, size_t size, const std::string& source) {
  if (size < 10 || std::memcmp(bytes, kNpyMagic, kNpyMagicBytes) != 0) {
    throw InvalidArgument(source + ": not a NumPy .npy file (no \\x93NUMPY magic); save arrays with numpy.save");
  }
  const int major = bytes[6];
  if (major < 1 || major > 3) {
    throw InvalidArgument(source + ": .npy format version " + std::to_string(major) + " is not one of 1, 2, 3");
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  size_t header_length = 0;
  for (size_t k = 0; k < length_bytes; ++k) header_length |= static_cast<size_t>(bytes[8 + k]) << (8 * k);
  const size_t data_start = 8 + length_bytes + header_length;
  if (data_start > size) {
    throw InvalidArgument(source + ": the .npy header claims " + std::to_string(header_length) +
                          " bytes, more than the file holds; the file is truncated");
  }
  const std::string header(reinterpret_cast<const char*>(bytes) + 8 + length_bytes, header_length);
  const NpyHeader parsed = NpyHeaderParser(header, source).parse();
  const std::string& descr = parsed.descr;
  HostArray a;
  if (!parse_npy_descr(descr, &a.dtype)) {
    throw InvalidArgument(source + ": dtype '" + descr + "' is not read; expected little-endian float32, float64 " +
                          "or an integer type (numpy: array.astype('<f4'))");
  }
  if (parsed.fortran_order) {
    throw InvalidArgument(source + ": a Fortran-ordered array; save a C-ordered one (numpy.ascontiguousarray)");
  }
  a.shape = parsed.shape;
  const int64_t count = checked_count(a.shape, dtype_size(a.dtype), source);
  const size_t expected = static_cast<size_t>(count) * dtype_size(a.dtype);
  if (size - data_start != expected) {
    throw InvalidArgument(source + ": shape " + shape_str(a.shape) + " of " + dtype_name(a.dtype) + " needs " +
                          std::to_string(expected) + " bytes of data, the file has " +
                          std::to_string(size - data_start) + (size - data_start < expected ? " (truncated)" : ""));
  }
  a.bytes.assign(bytes + data_start, bytes + size);
  return a;
}

HostArray read_npy(const std::string& path) {
  const std::string contents = io::read_file(path);
  return parse_npy(reinterpret_cast<const uint8_t*>(contents.data()), contents.size(), path);
}

void write_npy(const std::string& path, const HostArray& array) {
  DDP_CHECK(static_cast<size_t>(array.count()) * dtype_size(array.dtype) == array.bytes.size(),
            "write_npy: the bytes do not match shape " + shape_str(array.shape));
  std::string shape = "(";
  for (int64_t d : array.shape) shape += std::to_string(d) + ", ";
  if (array.shape.size() > 1) shape.resize(shape.size() - 2);
  if (array.shape.size() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string header =
      std::string("{'descr': '") + npy_descr(array.dtype) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // The data starts on a 64-byte boundary; the header ends with a newline.
  const size_t unpadded = kNpyMagicBytes + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kNpyMagic, kNpyMagicBytes);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(array.bytes.data()), array.bytes.size());
  io::write_file_atomically(path, out);
}

bool is_array_dataset(const std::string& path) {
  if (ends_with(path, ".safetensors")) return true;
  struct stat info;
  return is_directory(path) && ::stat((path + "/features.npy").c_str(), &info) == 0;
}

Dataset load_array_dataset(const std::string& path) {
  if (ends_with(path, ".safetensors")) {
    const io::SafetensorsFile file = io::load_safetensors(path);
    for (const char* name : {"features", "targets"}) {
      if (file.find(name) == nullptr) {
        throw InvalidArgument(path + ": no tensor '" + name + "'; a data set file holds 'features' [N, F] and " +
                              "'targets' ([N] integer class labels, or [N] / [N, W] float targets)");
      }
    }
    Dataset d = make_array_dataset(safetensors_array(file, "features"), safetensors_array(file, "targets"), path);
    d.files = {path};
    return d;
  }
  if (!is_directory(path)) {
    throw InvalidArgument(path + ": no such data set; pass a directory with features.npy and targets.npy, a " +
                          ".safetensors file, or a directory with the Fashion-MNIST IDX files");
  }
  const std::string features = path + "/features.npy", targets = path + "/targets.npy";
  Dataset d = make_array_dataset(read_npy(features), read_npy(targets), features + " and " + targets);
  d.files = {features, targets};
  return d;
}

namespace {

constexpr const char* kDataSetForms =
    "name a directory with features.npy and targets.npy, a .safetensors file, or a directory with the four "
    "Fashion-MNIST .gz files";

// Whether `path` names one's own arrays (false: Fashion-MNIST's IDX files); else InvalidArgument saying what was
// looked for and what was found there, so that a mistyped path is not answered with how to install Fashion-MNIST.
bool names_own_arrays(const std::string& path) {
  if (path.empty()) throw InvalidArgument(std::string("the data set's path is empty: ") + kDataSetForms);
  if (ends_with(path, ".safetensors")) return true;
  const bool default_dir = path == kDefaultFashionMnistDir;
  const std::string install = default_dir ? std::string("; install the data set (apt-get install "
                                                        "dataset-fashion-mnist, which fills ") +
                                                kDefaultFashionMnistDir + ")"
                                          : "; " + std::string(kDataSetForms);
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    std::string why = error == ENOENT  ? "no such file or directory"
                      : error == ELOOP ? "a loop of symbolic links"
                      : error == EACCES
                          ? "permission denied: a directory on the way cannot be searched by this user"
                          : std::strerror(error);
    throw InvalidArgument("data set " + path + ": " + why + install);
  }
  if (!S_ISDIR(info.st_mode)) {
    throw InvalidArgument("data set " + path + ": it is " + io::file_kind(info.st_mode) +
                          ", neither a .safetensors file nor a directory; " + kDataSetForms);
  }
  auto has = [&path](const std::string& name) -> bool {
    struct stat entry;
    if (::stat((path + "/" + name).c_str(), &entry) == 0) return true;
    if (errno == EACCES) {
      throw InvalidArgument("data set " + path + ": the directory cannot be searched by this user (permission "
                            "denied); give it read and search permission (chmod a+rx)");
    }
    return false;
  };
  const bool features = has("features.npy"), targets = has("targets.npy");
  if (features && targets) return true;
  if (features || targets) {
    throw InvalidArgument("data set " + path + ": the directory has " + (features ? "features.npy" : "targets.npy") +
                          " but no " + (features ? "targets.npy" : "features.npy") +
                          "; a directory data set holds both (features [N, F], targets [N] or [N, W])");
  }
  for (Split split : {Split::kTrain, Split::kTest}) {
    if (has(fashion_mnist_images_file(split)) || has(fashion_mnist_labels_file(split))) return false;
  }
  throw InvalidArgument("data set " + path + ": the directory holds neither features.npy and targets.npy nor " +
                        "Fashion-MNIST's files (" + fashion_mnist_images_file(Split::kTrain) + ", ...)" + install);
}

}  // namespace

TrainTest load_train_test(const std::string& path, const std::string& test_path) {
  const bool own = names_own_arrays(path);
  auto read = [own, &path, &test_path](bool test) {
    try {
      if (!own) return load_fashion_mnist(path, test ? Split::kTest : Split::kTrain);
      const std::string& file = test ? test_path : path;
      return file.empty() ? Dataset{} : load_array_dataset(file);
    } catch (const std::bad_alloc&) {
      throw InvalidArgument("not enough memory to hold the data set " + (test ? test_path : path) +
                            " in this process; use a machine with more memory, or fewer ranks on this node");
    }
  };
  auto test = std::async(std::launch::async, read, true);
  TrainTest sets{read(false), Dataset{}};
  sets.test = test.get();
  if (!own && sets.train.size < sets.test.size) {
    throw InvalidArgument("the training set of " + path + " has " + std::to_string(sets.train.size) +
                          " samples and the test set " + std::to_string(sets.test.size) +
                          ": are the train-* and t10k-* files swapped?");
  }
  return sets;
}

Dataset make_array_dataset(const HostArray& features, const HostArray& targets, const std::string& source) {
  const std::string x = source + ": features", y = source + ": targets";
  if (features.shape.empty() || features.shape.size() > 2 || features.count() == 0) {
    throw InvalidArgument(x + " have shape " + shape_str(features.shape) + "; expected [N, F] or [N] with N, F > 0");
  }
  if (!is_integer(features.dtype) && features.dtype != DType::kFloat32 && features.dtype != DType::kFloat64) {
    throw InvalidArgument(x + " are " + dtype_name(features.dtype) + "; expected float32, float64 or integers");
  }
  const int64_t n = features.shape[0];
  if (targets.shape.empty() || targets.shape.size() > 2 || targets.shape[0] != n) {
    throw InvalidArgument(y + " have shape " + shape_str(targets.shape) + "; expected [" + std::to_string(n) +
                          "] or [" + std::to_string(n) + ", W], one row per row of the features");
  }
  Dataset d;
  d.size = n;
  d.feature_count = features.shape.size() == 2 ? features.shape[1] : 1;
  d.features = as_floats(features, x);
  if (is_integer(targets.dtype)) {
    if (targets.shape.size() != 1) {
      throw InvalidArgument(y + " are integers of shape " + shape_str(targets.shape) + "; class labels are [" +
                            std::to_string(n) + "] (for regression store float targets)");
    }
    d.labels.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double label = element(targets, i);
      if (label < 0 || label > std::numeric_limits<int32_t>::max() - 1) {
        throw InvalidArgument(y + ": label " + std::to_string(static_cast<long long>(label)) + " at row " +
                              std::to_string(i) + " is not a class index 0, 1, ...");
      }
      if (label >= kMaxClasses) {
        // The model's output layer has a row per class: past this, building it runs out of memory on every rank.
        throw InvalidArgument(y + ": label " + std::to_string(static_cast<long long>(label)) + " at row " +
                              std::to_string(i) + " asks for " + std::to_string(static_cast<long long>(label) + 1) +
                              " classes, more than " + std::to_string(kMaxClasses) + " (the model's output layer "
                              "has a row of weights per class); class labels are 0 to C-1: renumber them, or store "
                              "float targets for regression");
      }
      d.labels[static_cast<std::size_t>(i)] = static_cast<int32_t>(label);
      d.num_classes = std::max(d.num_classes, static_cast<int>(label) + 1);
    }
    return d;
  }
  if (targets.dtype != DType::kFloat32 && targets.dtype != DType::kFloat64) {
    throw InvalidArgument(y + " are " + dtype_name(targets.dtype) + "; expected integer class labels or float32 / " +
                          "float64 regression targets");
  }
  d.target_width = targets.shape.size() == 2 ? targets.shape[1] : 1;
  if (d.target_width == 0) throw InvalidArgument(y + " have width 0");
  d.targets = as_floats(targets, y);
  return d;
}

}  // namespace data
}  // namespace ddp
