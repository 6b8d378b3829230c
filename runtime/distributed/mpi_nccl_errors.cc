// NCCL and MPI status codes into NcclError and MpiError.
#include "runtime/distributed/mpi_nccl_errors.h"

#include <mpi.h>
#include <nccl.h>

#include <cstdio>

namespace ddp::detail {

std::string nccl_error_string(int code) {
  std::string text = ncclGetErrorString(static_cast<ncclResult_t>(code));
  // NCCL keeps the reason of the last failure; set NCCL_DEBUG=WARN to see it on stderr as well.
  text += "; set NCCL_DEBUG=WARN for NCCL's own account of the failure";
  return text;
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

void warn_nccl(int code, const char* call, const char* file, int line) noexcept {
  if (code == 0) return;
  std::fprintf(stderr, "%s:%d: warning: NCCL call `%s` failed: %s\n", file, line, call,
               ncclGetErrorString(static_cast<ncclResult_t>(code)));
}

}  // namespace ddp::detail
