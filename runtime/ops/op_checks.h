// Input validation shared by the tensor-level ops: every message names the op and the shapes involved.
#pragma once

#include <string>

#include "runtime/core/check.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp::ops::detail {

inline void check_defined(const char* op, const char* what, const Tensor& t) {
  DDP_CHECK(t.defined(), std::string(op) + ": " + what + " is undefined");
}

inline void check_same_device(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  DDP_CHECK(a.device() == b.device(), std::string(op) + ": " + an + " is on " + a.device().str() + " but " + bn +
                                          " is on " + b.device().str());
}

inline void check_stream(const char* op, const Tensor& t, const Stream& stream) {
  if (t.device().is_cuda()) {
    DDP_CHECK(stream.device() == t.device(), std::string(op) + ": tensors on " + t.device().str() +
                                                 " need a stream of that device, got one of " +
                                                 stream.device().str());
  }
}

inline void check_dtype(const char* op, const char* what, const Tensor& t, DType dtype) {
  DDP_CHECK(t.dtype() == dtype, std::string(op) + ": " + what + " must be " + dtype_name(dtype) + ", got " +
                                    t.describe());
}

// A defined float32 tensor whose device `stream` can run on: the inputs of the float32-only ops.
inline void check_float_input(const char* op, const char* what, const Tensor& t, const Stream& stream) {
  check_defined(op, what, t);
  check_dtype(op, what, t, DType::kFloat32);
  check_stream(op, t, stream);
}

}  // namespace ddp::ops::detail
