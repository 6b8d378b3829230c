// A user's own data set from files: NumPy .npy arrays or a safetensors file, the formats PyTorch and NumPy
// users already have their data in (np.save, safetensors.numpy.save_file / safetensors.torch.save_file).
//
// A data set is `features` [N, F] (or [N]: one feature) and `targets`:
//   - integers [N] (any integer dtype): class labels 0..C-1, trained with cross-entropy (C = the largest + 1);
//   - floats [N] or [N, W] (float32 or float64): regression targets of width W (1 for [N]).
// It is read from a directory holding features.npy and targets.npy, or from one .safetensors file holding the
// tensors "features" and "targets". Floats are converted to float32, integers to int32. Anything that is not
// what it claims (a bad magic number, a Fortran-ordered or big-endian array, a dtype other than these, a
// length that differs from the header, rows that differ between features and targets, a negative label, a
// non-finite value) is an InvalidArgument naming the file, the array and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/data/idx.h"

namespace ddp {
namespace data {

// An array as read: its dtype, shape and little-endian bytes (C order).
struct HostArray {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int64_t count() const;  // product of shape
};

// Largest array file accepted (8 GiB): beyond it the data set would not fit a device anyway.
constexpr uint64_t kMaxArrayBytes = uint64_t{8} << 30;

// Parses a .npy file held in memory (format versions 1, 2 and 3). `source` names it in errors.
HostArray parse_npy(const uint8_t* bytes, size_t size, const std::string& source);
HostArray read_npy(const std::string& path);
// Writes `array` as a version 1.0 .npy file (for tests and tools; atomically).
void write_npy(const std::string& path, const HostArray& array);

// True when `path` is a data set this file reads: a .safetensors file, or a directory with features.npy.
bool is_array_dataset(const std::string& path);
// Reads a data set as the top of this file says.
Dataset load_array_dataset(const std::string& path);
// The training and test sets one path names: a directory of Fashion-MNIST's IDX files (its two splits), or one's
// own arrays (load_array_dataset), the test set then from `test_path` (none when it is empty). Both are read at
// once, on threads of their own. Throws InvalidArgument naming the file (a train and test split that look
// swapped, or a data set larger than this process can hold, too).
struct TrainTest {
  Dataset train;
  Dataset test;
};
TrainTest load_train_test(const std::string& path, const std::string& test_path = "");

// The most classes a data set of class labels may have: a label past it is refused when the data set is built,
// naming the label, its row and the count it asks for.
constexpr int kMaxClasses = 1 << 20;

// Builds a data set from a features array and a targets array (`source` names where they came from).
Dataset make_array_dataset(const HostArray& features, const HostArray& targets, const std::string& source);

}  // namespace data
}  // namespace ddp
