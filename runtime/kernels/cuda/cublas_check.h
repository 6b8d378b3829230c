// DDP_CUBLAS_CHECK: a failed cuBLAS / cuBLASLt call as a typed exception naming the call and cuBLAS's reason.
// Here rather than in runtime/core so that only the kernel layer links cuBLAS.
#pragma once

#include "runtime/core/check.h"

namespace ddp {

class CublasError : public LibraryError {
  using LibraryError::LibraryError;
};

namespace detail {
[[noreturn]] void throw_cublas(int code, const char* call, const char* file, int line);
}  // namespace detail
}  // namespace ddp

#define DDP_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                            \
    const int ddp_status_ = static_cast<int>(call);                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_cublas(ddp_status_, #call, __FILE__, __LINE__);    \
  } while (0)
