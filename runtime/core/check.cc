// Turns CUDA status codes and failed checks into typed exceptions with readable messages.
#include "runtime/core/check.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

namespace ddp {
namespace detail {

std::string location(const char* file, int line) {
  if (file == nullptr || *file == '\0') return "";
  return std::string(file) + ":" + std::to_string(line) + ": ";
}

}  // namespace detail

using detail::location;

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(message), file_(file ? file : ""), line_(line), user_message_(message) {}

Error::Error(const std::string& message, const std::string& user_message, const char* file, int line)
    : std::runtime_error(message), file_(file ? file : ""), line_(line), user_message_(user_message) {}

LibraryError::LibraryError(const std::string& library, int code, const std::string& call,
                           const std::string& detail, const char* file, int line)
    : Error(location(file, line) + library + " call `" + call + "` failed with status " +
                std::to_string(code) + ": " + detail,
            library + " failed with status " + std::to_string(code) + ": " + detail, file, line),
      code_(code),
      call_(call) {}

namespace detail {

std::string cuda_error_string(int code) {
  const auto err = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

void throw_cuda(int code, const char* call, const char* file, int line) {
  throw CudaError("CUDA", code, call, cuda_error_string(code), file, line);
}

void throw_check(const char* condition, const std::string& message, const char* file, int line) {
  throw InvalidArgument(location(file, line) + message + " (check `" + condition + "` failed)", message, file, line);
}

void throw_assert(const char* condition, const std::string& message, const char* file, int line) {
  const std::string what = "internal error (a bug in the runtime; please report it): " + message;
  throw InternalError(location(file, line) + what + " (`" + condition + "` does not hold)", what, file, line);
}

void warn_cuda(int code, const char* call, const char* file, int line) noexcept {
  if (code == 0) return;
  std::fprintf(stderr, "%s:%d: warning: CUDA call `%s` failed: %s\n", file, line, call,
               cuda_error_string(code).c_str());
}

}  // namespace detail
}  // namespace ddp
