// IDX files (the format MNIST and Fashion-MNIST ship in) and the Fashion-MNIST dataset built from them.
//
// The dataset is the first thing a training job touches, and a bad download or a wrong --data directory must end
// with a message that names the file, says what is wrong with it and what to do, not with a crash or with
// training on garbage. Every length in the file is checked before it is used; `parse_idx` works on bytes in
// memory so the fuzzer can drive it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
namespace data {

// One IDX array of unsigned bytes (type code 0x08, the only type the MNIST family uses).
struct IdxArray {
  std::vector<uint32_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> values;  // row-major, product(dims) bytes
  int64_t count() const { return dims.empty() ? 0 : static_cast<int64_t>(dims[0]); }
};

// Largest decompressed IDX file accepted; the Fashion-MNIST training images are 47 MB.
constexpr size_t kMaxIdxBytes = size_t{1} << 30;

// Parses an IDX file already in memory. `source` names it in error messages. Throws InvalidArgument on a bad
// magic number, an unsupported type, a zero or huge dimension, or a length that differs from the header's.
IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& source);

// Decompresses gzip data in memory (for the fuzzer and for tests), refusing more than `max_bytes` of output.
std::vector<uint8_t> gunzip(const uint8_t* bytes, size_t size, const std::string& source,
                            size_t max_bytes = kMaxIdxBytes);

// Reads a gzip-compressed IDX file (zlib's gzread also reads an uncompressed file as is).
IdxArray read_idx_file(const std::string& path);

// A data set in host memory: features float32 [size, feature_count], and what each row is trained towards:
// a class (labels int32 [size], classification), or float targets of any width (targets [size, target_width],
// regression). target_width 0 means labels.
struct Dataset {
  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t size = 0;
  int64_t feature_count = 0;
  int num_classes = 0;
  std::vector<float> targets;
  int64_t target_width = 0;
  // The files it was read from (empty for data made in memory): a program's outputs must not overwrite them.
  std::vector<std::string> files;
  bool regression() const { return target_width > 0; }
};

// Non-owning view of a Dataset, what the loader gathers rows from (a user's own data fits it as well).
struct DatasetView {
  const float* features = nullptr;  // [size, feature_count]
  const int32_t* labels = nullptr;  // [size]; null for regression
  int64_t size = 0;
  int64_t feature_count = 0;
  const float* targets = nullptr;  // [size, target_width]; regression only
  int64_t target_width = 0;
  bool regression() const { return target_width > 0; }
  // A row's label or targets, as bytes: 4 for a label, 4·target_width for targets.
  int64_t y_row_bytes() const { return regression() ? target_width * 4 : 4; }
  const void* y_rows() const { return regression() ? static_cast<const void*>(targets) : labels; }
};
inline DatasetView view(const Dataset& d) {
  return {d.features.data(), d.regression() ? nullptr : d.labels.data(), d.size, d.feature_count,
          d.regression() ? d.targets.data() : nullptr, d.target_width};
}

// Fashion-MNIST as the training job uses it.
constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;
constexpr int kFashionMnistClasses = 10;
constexpr int64_t kFashionMnistFeatures = 28 * 28;  // the loader accepts [N, 28, 28] images only

enum class Split { kTrain, kTest };

// File names of a split: {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"} or the t10k pair.
std::string fashion_mnist_images_file(Split split);
std::string fashion_mnist_labels_file(Split split);

// Builds a dataset from an images array [N, H, W] and a labels array [N]: pixels scaled to [0, 1], then
// (x - mean) / std; labels checked to lie in [0, num_classes). The sources name the files in errors.
Dataset make_image_dataset(const IdxArray& images, const std::string& images_source, const IdxArray& labels,
                           const std::string& labels_source, int num_classes, float mean, float std_dev);

// Loads one split of Fashion-MNIST from `dir` (train: 60000 rows, test: 10000; 784 features).
Dataset load_fashion_mnist(const std::string& dir, Split split);

}  // namespace data
}  // namespace ddp
