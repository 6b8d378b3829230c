// Check macros of the communication libraries: a failed NCCL or MPI call as a typed exception naming the call and
// the library's reason (NCCL's with a pointer to NCCL_DEBUG). Here rather than in runtime/core so that only the
// distributed layer links NCCL and MPI (the launcher, for one, links neither).
#pragma once

#include <string>

#include "runtime/core/check.h"

namespace ddp {

class NcclError : public LibraryError {
  using LibraryError::LibraryError;
};
class MpiError : public LibraryError {
  using LibraryError::LibraryError;
};

namespace detail {
[[noreturn]] void throw_nccl(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_mpi(int code, const char* call, const char* file, int line);
void warn_nccl(int code, const char* call, const char* file, int line) noexcept;
std::string nccl_error_string(int code);
}  // namespace detail
}  // namespace ddp

// Both libraries use 0 for success, so the macros need neither header.
#define DDP_NCCL_CHECK(call)                                                                      \
  do {                                                                                            \
    const int ddp_status_ = static_cast<int>(call);                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_nccl(ddp_status_, #call, __FILE__, __LINE__);      \
  } while (0)

#define DDP_MPI_CHECK(call)                                                                       \
  do {                                                                                            \
    const int ddp_status_ = (call);                                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_mpi(ddp_status_, #call, __FILE__, __LINE__);       \
  } while (0)

// For destructors: print and continue.
#define DDP_NCCL_WARN(call) ::ddp::detail::warn_nccl(static_cast<int>(call), #call, __FILE__, __LINE__)
