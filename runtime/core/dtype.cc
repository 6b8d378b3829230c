// The table of element types: size and both spellings in one place.
#include "runtime/core/dtype.h"

#include "runtime/core/check.h"

namespace ddp {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  const char* safetensors_name;
  std::size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", "F32", 4}, {DType::kBFloat16, "bfloat16", "BF16", 2},
    {DType::kInt32, "int32", "I32", 4},     {DType::kInt64, "int64", "I64", 8},
    {DType::kBool, "bool", "BOOL", 1},      {DType::kUInt8, "uint8", "U8", 1},
    {DType::kInt8, "int8", "I8", 1},        {DType::kInt16, "int16", "I16", 2},
    {DType::kFloat16, "float16", "F16", 2}, {DType::kFloat64, "float64", "F64", 8},
};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == dtype) return i;
  }
  throw InternalError("unknown DType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

std::size_t dtype_size(DType dtype) { return info(dtype).size; }
const char* dtype_name(DType dtype) { return info(dtype).name; }
const char* safetensors_dtype_name(DType dtype) { return info(dtype).safetensors_name; }

bool parse_safetensors_dtype(const std::string& name, DType* dtype) {
  for (const DTypeInfo& i : kDTypes) {
    if (name == i.safetensors_name) {
      *dtype = i.dtype;
      return true;
    }
  }
  return false;
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape, const char* separator) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? separator : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace ddp
