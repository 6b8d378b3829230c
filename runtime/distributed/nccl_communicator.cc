#include "runtime/distributed/nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/core/deadline.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// A non-blocking communicator answers many calls with ncclInProgress and finishes enqueuing them within
// microseconds: a sleep at the first poll would make every eager collective cost a sleep on the host. So the wait spins
// first, then sleeps.
constexpr auto kSpinBeforeSleeping = std::chrono::milliseconds(2);

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MPI_Comm comm, const Device& device,
                                                           double timeout_s) {
  DDP_CHECK(device.is_cuda(), "an NCCL communicator needs a CUDA device, got " + device.str());
  int rank = 0;
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));

  // The ID travels with rank 0's status, so a failure there ends every rank instead of leaving them waiting.
  struct {
    int status;
    ncclUniqueId id;
  } message;
  std::memset(&message, 0, sizeof(message));
  if (rank == 0) message.status = static_cast<int>(ncclGetUniqueId(&message.id));
  run_host_collective("MPI_Bcast (NCCL's unique id)", sizeof(message), DType::kUInt8, [&](MPI_Request* request) {
    return MPI_Ibcast(&message, sizeof(message), MPI_BYTE, 0, comm, request);
  });
  if (message.status != ncclSuccess) {
    throw NcclError("NCCL", message.status, "ncclGetUniqueId (on rank 0)",
                    detail::nccl_error_string(message.status), __FILE__, __LINE__);
  }

  CudaDeviceGuard guard(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // lets a watchdog abort a stalled collective
  ncclComm_t handle = nullptr;
  const ncclResult_t status = ncclCommInitRankConfig(&handle, size, message.id, rank, &config);
  if (status != ncclSuccess && status != ncclInProgress) DDP_NCCL_CHECK(status);
  std::unique_ptr<NcclCommunicator> communicator(new NcclCommunicator(handle, device, rank, size, timeout_s));
  communicator->wait_ready(timeout_s, "ncclCommInitRankConfig");
  return communicator;
}

void NcclCommunicator::wait_ready(double timeout_s, const char* what) {
  const auto start = Clock::now();
  // Running time, as every collective deadline: a job stopped while NCCL connects is not late.
  const Deadline deadline(timeout_s);
  while (true) {
    ncclResult_t state = ncclSuccess;
    DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort();
      throw NcclError("NCCL", state, what, detail::nccl_error_string(state), __FILE__, __LINE__);
    }
    if (deadline.passed()) {
      abort();
      throw NcclError("NCCL", ncclInProgress, what,
                      "still in progress after " + std::to_string(timeout_s) +
                          " s; the communicator was aborted (is every rank alive and reaching this call?)",
                      __FILE__, __LINE__);
    }
    if (Clock::now() - start < kSpinBeforeSleeping) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclCommunicator::complete(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  if (status == ncclInProgress) {
    wait_ready(timeout_s_, call);
    return;
  }
  detail::throw_nccl(status, call, file, line);
}

void NcclCommunicator::abort() {
  if (comm_ == nullptr) return;
  DDP_NCCL_WARN(ncclCommAbort(comm_));
  comm_ = nullptr;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr) return;
  CudaDeviceGuard guard(device_);
  // Finalize flushes outstanding work; with a non-blocking communicator it may report "in progress".
  ncclResult_t status = ncclCommFinalize(comm_);
  if (status == ncclSuccess || status == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress && Clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (state == ncclSuccess) {
      DDP_NCCL_WARN(ncclCommDestroy(comm_));
      comm_ = nullptr;
      return;
    }
  }
  abort();
}

}  // namespace ddp
