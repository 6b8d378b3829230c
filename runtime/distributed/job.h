// What a program sees of the job it runs in, apart from its Session: the device it asks for, the error every
// rank raised together, an MPI application's communicator, and run_main, which ends every rank on an error.
// Public (ddp.h reaches it); the World underneath (world.h) is the runtime's own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/core/check.h"

namespace ddp {

enum class DeviceRequest { kAuto, kCpu, kCuda };

// Parses "auto" | "cpu" | "cuda"; throws InvalidArgument naming the choices otherwise.
DeviceRequest parse_device_request(const std::string& text);

// What an error the ranks agree on says about a retry: most may pass (a full disk, a node that failed), one in the
// job's input never does (a bad flag, a data set that does not fit the model) and is not restarted by ddprun.
enum class AgreedError { kMayPassOnRetry, kInput };

// An error every rank raised together (the ranks agreed on it): it is reported once, by rank 0.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& message, int rank, AgreedError kind = AgreedError::kMayPassOnRetry)
      : Error(message), rank_(rank), kind_(kind) {}
  int rank() const { return rank_; }  // the rank that raised this copy
  AgreedError kind() const { return kind_; }

 private:
  int rank_;
  AgreedError kind_;
};

// An application's MPI communicator, carried as its Fortran handle (MPI_Comm_c2f) so that no public header
// needs <mpi.h>. Make one with ddp::communicator(MPI_Comm) from ddp_mpi.h, or from Fortran's integer handle.
struct ApplicationCommunicator {
  std::int64_t fortran_handle = -1;
};

// The MPI thread level the runtime needs when an application started MPI itself: MPI_THREAD_MULTIPLE, since the
// runtime's communication thread calls MPI while the application's threads may call it too. Returns "" when the
// running MPI provides it, else what to change (names the level provided and the call to make).
std::string mpi_thread_level_problem();

// Runs `body`; an exception that escapes it is printed with the rank and ends the job on every rank
// (MPI_Abort), unless all ranks raised it together, in which case rank 0 prints it and exits with 1 (with
// kInputErrorExitStatus for an AgreedError::kInput), the others with 0 once it has printed (so that mpirun, which
// ends the job at the first non-zero status, relays it whole).
int run_main(const std::function<int()>& body);
// The status rank 0 exits with for an agreed error: kStopFailedExitStatus once a stop was asked for (a stop is
// never restarted), kInputErrorExitStatus for AgreedError::kInput, else 1.
int agreed_error_exit_status(const CollectiveError& e);

}  // namespace ddp
