// The check macros (runtime/core's, the kernel layer's cuBLAS check, the distributed layer's NCCL and MPI checks)
// turn each library's failure status into the right exception type, with file, line and the text of the failing
// call in the message; success statuses pass through; DDP_CHECK and DDP_ASSERT throw their two kinds.
#include "runtime/core/check.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>

#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/kernels/cuda/cublas_check.h"

namespace ddp {
namespace {

template <typename ErrorType, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const ErrorType& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return "";
}

TEST(Check, CudaFailureThrowsCudaErrorWithCallAndLocation) {
  int line = 0;
  const std::string what = message_of<CudaError>([&] {
    line = __LINE__ + 1;
    DDP_CUDA_CHECK(cudaErrorInvalidValue);
  });
  EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
  EXPECT_NE(what.find("check_test.cc:" + std::to_string(line)), std::string::npos) << what;
  EXPECT_NE(what.find("`cudaErrorInvalidValue`"), std::string::npos) << what;
}

TEST(Check, CudaErrorCarriesCode) {
  try {
    DDP_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL();
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), static_cast<int>(cudaErrorMemoryAllocation));
    EXPECT_EQ(e.call(), "cudaErrorMemoryAllocation");
    EXPECT_GT(e.line(), 0);
  }
}

TEST(Check, CublasFailureThrowsCublasError) {
  const std::string what = message_of<CublasError>([] { DDP_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  EXPECT_NE(what.find("cuBLAS"), std::string::npos) << what;
  EXPECT_NE(what.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << what;
}

TEST(Check, NcclFailureThrowsNcclErrorWithHint) {
  const std::string what = message_of<NcclError>([] { DDP_NCCL_CHECK(ncclInvalidUsage); });
  EXPECT_NE(what.find("NCCL"), std::string::npos) << what;
  EXPECT_NE(what.find("NCCL_DEBUG"), std::string::npos) << what;
}

TEST(Check, SuccessPassesThrough) {
  EXPECT_NO_THROW(DDP_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(DDP_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
  EXPECT_NO_THROW(DDP_NCCL_CHECK(ncclSuccess));
  EXPECT_NO_THROW(DDP_CHECK(1 + 1 == 2, "arithmetic"));
}

TEST(Check, InvariantThrowsInvalidArgumentWithMessage) {
  const std::string what = message_of<InvalidArgument>([] { DDP_CHECK(2 < 1, "batch size must be positive"); });
  EXPECT_NE(what.find("batch size must be positive"), std::string::npos) << what;
  EXPECT_NE(what.find("2 < 1"), std::string::npos) << what;
}

TEST(Check, BrokenInvariantThrowsInternalErrorThatSaysSo) {
  const std::string what = message_of<InternalError>([] { DDP_ASSERT(2 < 1, "bucket 3 was launched twice"); });
  EXPECT_NE(what.find("internal error (a bug in the runtime; please report it): bucket 3 was launched twice"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("2 < 1"), std::string::npos) << what;
  EXPECT_THROW(DDP_ASSERT(false, "x"), Error);
  bool input_error = false;
  try {
    DDP_ASSERT(false, "x");
  } catch (const InvalidArgument&) {
    input_error = true;
  } catch (const InternalError&) {
  }
  EXPECT_FALSE(input_error) << "a broken invariant must not read as the caller's bad input";
}

TEST(Check, AllLibraryErrorsAreDdpErrors) {
  EXPECT_THROW(DDP_CUDA_CHECK(cudaErrorInvalidValue), Error);
  EXPECT_THROW(DDP_NCCL_CHECK(ncclSystemError), LibraryError);
}

TEST(Check, WarnVariantsDoNotThrow) {
  EXPECT_NO_THROW(DDP_CUDA_WARN(cudaErrorInvalidValue));
  EXPECT_NO_THROW(DDP_NCCL_WARN(ncclInternalError));
}

}  // namespace
}  // namespace ddp
