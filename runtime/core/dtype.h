// Element types and shapes: the one definition every layer uses (kernels, tensors, communication, files).
//
// The first four are the types the runtime computes and communicates in; the others complete the safetensors
// set, so that a checkpoint file holding them can be read and refused by name rather than misread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

enum class DType : std::uint8_t {
  kFloat32,
  kBFloat16,
  kInt32,
  kInt64,
  // Only in files:
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kFloat16,
  kFloat64,
};

// True for the four types tensors hold and kernels compute in.
constexpr bool is_compute_dtype(DType dtype) { return static_cast<int>(dtype) <= static_cast<int>(DType::kInt64); }

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);              // PyTorch's spelling: "float32", "bfloat16", "int32", ...
const char* safetensors_dtype_name(DType dtype);  // the file format's: "F32", "BF16", "I32", ...
// False when `name` is no safetensors dtype.
bool parse_safetensors_dtype(const std::string& name, DType* dtype);

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
// "[64, 784]" (as torch.Size prints), or with another separator ("," gives safetensors' header spelling).
std::string shape_str(const Shape& shape, const char* separator = ", ");

}  // namespace ddp
