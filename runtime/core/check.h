// The runtime's errors, the CUDA runtime's check macros, and the two checks of our own: DDP_CHECK for what a
// caller passed in, DDP_ASSERT for the runtime's own invariants. The other libraries' checks live with the layer
// that links them: cuBLAS in runtime/kernels/cuda/cublas_check.h, NCCL and MPI in
// runtime/distributed/mpi_nccl_errors.h, so this bottom layer links the CUDA runtime only.
//
// Each failing call becomes a typed exception that carries the file, the line and the text of the call, so an
// error from rank 3 deep inside a bucket all-reduce still says exactly what failed. Destructors must not throw:
// every one that calls a library uses a *_WARN twin, which prints and carries on.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Base of every error the runtime raises. `what()` is the full message; the parts are kept for callers that
// want to report them separately.
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file = "", int line = 0);
  // `user_message`: the same without what only the runtime's developers read (the source location, the text of
  // the failed check or call).
  Error(const std::string& message, const std::string& user_message, const char* file, int line);
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  // What an API for users (the C API) shows: what() less the source location and the checked code.
  const std::string& user_message() const { return user_message_; }

 private:
  std::string file_;
  int line_;
  std::string user_message_;
};

// A library call returned a failure status. `code()` is the library's own status value.
class LibraryError : public Error {
 public:
  LibraryError(const std::string& library, int code, const std::string& call, const std::string& detail,
               const char* file, int line);
  int code() const { return code_; }
  const std::string& call() const { return call_; }

 private:
  int code_;
  std::string call_;
};

class CudaError : public LibraryError {
  using LibraryError::LibraryError;
};

// Bad input from a user (flags, files, shapes, calls in an order that cannot work): the message says what was
// wrong and what to do.
class InvalidArgument : public Error {
  using Error::Error;
};

// Memory the runtime asked for (host or device) was not there: the allocator's message says how much.
class OutOfMemory : public Error {
  using Error::Error;
};

// A broken invariant of the runtime itself: a bug to report, not something the caller can fix.
class InternalError : public Error {
  using Error::Error;
};

namespace detail {
// "file:line: " (empty for an empty file name), the prefix of every located message.
std::string location(const char* file, int line);
[[noreturn]] void throw_cuda(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_check(const char* condition, const std::string& message, const char* file, int line);
[[noreturn]] void throw_assert(const char* condition, const std::string& message, const char* file, int line);
void warn_cuda(int code, const char* call, const char* file, int line) noexcept;
std::string cuda_error_string(int code);
}  // namespace detail
}  // namespace ddp

// CUDA uses 0 for success, so the macros need none of its headers.
#define DDP_CUDA_CHECK(call)                                                                      \
  do {                                                                                            \
    const int ddp_status_ = static_cast<int>(call);                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_cuda(ddp_status_, #call, __FILE__, __LINE__);      \
  } while (0)

// Checks after a kernel launch: the launch's own error (bad configuration) surfaces here, not at a later call.
#define DDP_CUDA_CHECK_LAUNCH() DDP_CUDA_CHECK(cudaGetLastError())

// For destructors: print and continue.
#define DDP_CUDA_WARN(call) ::ddp::detail::warn_cuda(static_cast<int>(call), #call, __FILE__, __LINE__)

// A precondition on the caller's input: InvalidArgument. `message` (any expression convertible to std::string)
// is evaluated only on failure, so it may build a string.
#define DDP_CHECK(condition, message)                                                             \
  do {                                                                                            \
    if (!(condition)) ::ddp::detail::throw_check(#condition, (message), __FILE__, __LINE__);      \
  } while (0)

// An invariant of the runtime's own: InternalError, "a bug in the runtime".
#define DDP_ASSERT(condition, message)                                                            \
  do {                                                                                            \
    if (!(condition)) ::ddp::detail::throw_assert(#condition, (message), __FILE__, __LINE__);     \
  } while (0)
