// Check macros for every library the runtime calls (CUDA, cuBLAS, NCCL, MPI) and for our own invariants.
//
// Each failing call becomes a typed exception that carries the file, the line and the text of the call, so an
// error from rank 3 deep inside a bucket all-reduce still says exactly what failed. Destructors must not throw:
// they use the *_WARN twins, which print and carry on.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

// Base of every error the runtime raises. `what()` is the full message; the parts are kept for callers that
// want to report them separately.
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file = "", int line = 0);
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string file_;
  int line_;
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
class CublasError : public LibraryError {
  using LibraryError::LibraryError;
};
class NcclError : public LibraryError {
  using LibraryError::LibraryError;
};
class MpiError : public LibraryError {
  using LibraryError::LibraryError;
};

// Bad input from a user (flags, files, shapes): the message says what was wrong and what to do.
class InvalidArgument : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_cuda(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_mpi(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_check(const char* condition, const std::string& message, const char* file, int line);
void warn_cuda(int code, const char* call, const char* file, int line) noexcept;
void warn_nccl(int code, const char* call, const char* file, int line) noexcept;
std::string cuda_error_string(int code);
std::string nccl_error_string(int code);
}  // namespace detail
}  // namespace ddp

// All four libraries use 0 for success, so the macros need none of their headers.
#define DDP_CUDA_CHECK(call)                                                                      \
  do {                                                                                            \
    const int ddp_status_ = static_cast<int>(call);                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_cuda(ddp_status_, #call, __FILE__, __LINE__);      \
  } while (0)

#define DDP_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                            \
    const int ddp_status_ = static_cast<int>(call);                                               \
    if (ddp_status_ != 0) ::ddp::detail::throw_cublas(ddp_status_, #call, __FILE__, __LINE__);    \
  } while (0)

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

// Checks after a kernel launch: the launch's own error (bad configuration) surfaces here, not at a later call.
#define DDP_CUDA_CHECK_LAUNCH() DDP_CUDA_CHECK(cudaGetLastError())

// For destructors: print and continue.
#define DDP_CUDA_WARN(call) ::ddp::detail::warn_cuda(static_cast<int>(call), #call, __FILE__, __LINE__)
#define DDP_NCCL_WARN(call) ::ddp::detail::warn_nccl(static_cast<int>(call), #call, __FILE__, __LINE__)

// An invariant or a precondition on input; `message` is any expression convertible to std::string.
#define DDP_CHECK(condition, message)                                                             \
  do {                                                                                            \
    if (!(condition)) ::ddp::detail::throw_check(#condition, (message), __FILE__, __LINE__);      \
  } while (0)
