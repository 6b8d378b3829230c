// cuBLAS status codes into CublasError.
#include "runtime/kernels/cuda/cublas_check.h"

#include <cublas_api.h>

namespace ddp::detail {

void throw_cublas(int code, const char* call, const char* file, int line) {
  throw CublasError("cuBLAS", code, call, cublasGetStatusString(static_cast<cublasStatus_t>(code)), file, line);
}

}  // namespace ddp::detail
