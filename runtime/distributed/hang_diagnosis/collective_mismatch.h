// DDP_DEBUG=collectives, the debug mode (as PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL): before every collective,
// process groups' and World's alike, the ranks compare what they are about to issue (operation, element count
// and type, root or reduction) over a communicator of its own, and the first difference fails at once on every
// rank, naming both sides, instead of a hang or a wrong result:
//   collective #5 differs across ranks (DDP_DEBUG=collectives):
//     rank 2: MPI_Bcast of 100 float32 elements (root 0), step 1
//     ranks 0,1,3: MPI_Allreduce of 4160 float32 elements (average), bucket 0 of 1, step 1
// It costs a small allgather per collective: a mode to find a bug with, not to train in. A rank that never
// issues the collective leaves the others in the comparison, which has the collective deadline (so the job
// still ends with the report of where every rank is).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "runtime/core/dtype.h"

namespace ddp {

// What every rank must issue alike, and (for the message) what it was for.
struct CollectiveFingerprint {
  std::int64_t seq = 0;
  char operation[32] = {0};
  std::int64_t count = 0;
  std::int32_t dtype = 0;
  std::int32_t root = -1;    // broadcasts
  std::int32_t reduce = -1;  // reductions: 0 sum, 1 average, 2 max
  std::int32_t bucket = -1;
  std::int32_t buckets = 0;
  std::int64_t step = 0;

  CollectiveFingerprint() = default;
  CollectiveFingerprint(std::int64_t seq, const char* operation, std::int64_t count, DType dtype, int root,
                        int reduce, int bucket, int buckets, std::int64_t step);
  bool same_collective(const CollectiveFingerprint& other) const;
  // "MPI_Allreduce of 4160 float32 elements (average), bucket 0 of 1, step 1"
  std::string text() const;
};

// Collective over `comm`: turns the check on, on every rank, when DDP_DEBUG names "collectives" on any rank
// (a check on some ranks only would itself hang). Returns, on every rank alike, what is wrong with DDP_DEBUG
// (a mode it does not know, on some rank), or an empty string.
std::string start_collective_mismatch(MPI_Comm comm);
// Frees the check's communicator (before MPI is finalised).
void stop_collective_mismatch();
bool collective_mismatch_enabled();

// With the check on: compares `mine` with every rank's and returns the message above when they differ (empty
// when they agree, or when the check is off). After a difference every later call returns it again at once,
// without communicating: the other ranks have stopped too.
std::string check_collective(const CollectiveFingerprint& mine);

}  // namespace ddp
