// Turns library status codes into typed exceptions with readable messages.
#include "runtime/core/check.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <string>

namespace ddp {
namespace {

std::string location(const char* file, int line) {
  if (file == nullptr || *file == '\0') return "";
  return std::string(file) + ":" + std::to_string(line) + ": ";
}

}  // namespace

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error(message), file_(file ? file : ""), line_(line) {}

LibraryError::LibraryError(const std::string& library, int code, const std::string& call,
                           const std::string& detail, const char* file, int line)
    : Error(location(file, line) + library + " call `" + call + "` failed with status " +
                std::to_string(code) + ": " + detail,
            file, line),
      code_(code),
      call_(call) {}

namespace detail {

std::string cuda_error_string(int code) {
  const auto err = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

std::string nccl_error_string(int code) {
  std::string text = ncclGetErrorString(static_cast<ncclResult_t>(code));
  // NCCL keeps the reason of the last failure; set NCCL_DEBUG=WARN to see it on stderr as well.
  text += "; set NCCL_DEBUG=WARN for NCCL's own account of the failure";
  return text;
}

void throw_cuda(int code, const char* call, const char* file, int line) {
  throw CudaError("CUDA", code, call, cuda_error_string(code), file, line);
}

void throw_cublas(int code, const char* call, const char* file, int line) {
  throw CublasError("cuBLAS", code, call, cublasGetStatusString(static_cast<cublasStatus_t>(code)), file,
                    line);
}

void throw_nccl(int code, const char* call, const char* file, int line) {
  throw NcclError("NCCL", code, call, nccl_error_string(code), file, line);
}

void throw_mpi(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  int initialized = 0;
  MPI_Initialized(&initialized);
  std::string detail = "MPI error";
  if (initialized && MPI_Error_string(code, text, &length) == MPI_SUCCESS) detail.assign(text, length);
  throw MpiError("MPI", code, call, detail, file, line);
}

void throw_check(const char* condition, const std::string& message, const char* file, int line) {
  throw InvalidArgument(location(file, line) + message + " (check `" + condition + "` failed)", file, line);
}

void warn_cuda(int code, const char* call, const char* file, int line) noexcept {
  if (code == 0) return;
  std::fprintf(stderr, "%s:%d: warning: CUDA call `%s` failed: %s\n", file, line, call,
               cuda_error_string(code).c_str());
}

void warn_nccl(int code, const char* call, const char* file, int line) noexcept {
  if (code == 0) return;
  std::fprintf(stderr, "%s:%d: warning: NCCL call `%s` failed: %s\n", file, line, call,
               ncclGetErrorString(static_cast<ncclResult_t>(code)));
}

}  // namespace detail
}  // namespace ddp
