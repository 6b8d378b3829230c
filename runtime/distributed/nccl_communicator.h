// A move-only owner of an NCCL communicator created non-blocking, so a stalled collective can be aborted.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include <memory>

#include "runtime/core/device.h"
#include "runtime/distributed/mpi_nccl_errors.h"

namespace ddp {

class NcclCommunicator {
 public:
  // Collective over `comm`: rank 0 makes the unique ID, MPI broadcasts it, every rank joins on `device`.
  // Throws on every rank (never hangs) if rank 0 cannot make an ID; a join that outlasts `timeout_s` is
  // aborted and raises.
  static std::unique_ptr<NcclCommunicator> create(MPI_Comm comm, const Device& device, double timeout_s);

  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ncclComm_t handle() const { return comm_; }
  const Device& device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Waits until the communicator has no operation in progress, raising its asynchronous error if any, or
  // aborting it after `timeout_s`.
  void wait_ready(double timeout_s, const char* what);
  // Completes an NCCL call made on this communicator: a non-blocking communicator may answer "in progress",
  // which is waited out (up to the communicator's timeout); any other failure throws NcclError.
  void complete(ncclResult_t status, const char* call, const char* file, int line);
  double timeout_s() const { return timeout_s_; }

  // Aborts every operation in flight and frees the communicator; safe to call from a watchdog.
  void abort();

 private:
  NcclCommunicator(ncclComm_t comm, const Device& device, int rank, int size, double timeout_s)
      : comm_(comm), device_(device), rank_(rank), size_(size), timeout_s_(timeout_s) {}

  ncclComm_t comm_ = nullptr;
  Device device_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_ = 300.0;
};

}  // namespace ddp

// An NCCL call on communicator `comm` (a NcclCommunicator*), completed as NcclCommunicator::complete says.
#define DDP_NCCL_CALL(comm, call) (comm)->complete((call), #call, __FILE__, __LINE__)
