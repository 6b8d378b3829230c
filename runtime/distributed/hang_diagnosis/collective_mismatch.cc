#include "runtime/distributed/hang_diagnosis/collective_mismatch.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/hang_diagnosis/collective_deadline.h"
#include "runtime/distributed/hang_diagnosis/stall_report.h"
#include "runtime/distributed/mpi_nccl_errors.h"

namespace ddp {
namespace {

struct CheckState {
  std::atomic<bool> enabled{false};
  std::mutex mutex;  // one comparison at a time: each is an allgather on one communicator
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::string failure;  // the first difference, once seen
};

CheckState& state() {
  static CheckState s;
  return s;
}

// DDP_DEBUG=collectives (runtime/core/settings.h). Returns whether it is on; `error` says why a value is refused.
bool debug_collectives_requested(std::string* error) {
  try {
    return settings::text(settings::setting("DDP_DEBUG")) == "collectives";
  } catch (const InvalidArgument& e) {
    *error = std::string(e.what()) + " (compare every collective across ranks before issuing it)";
    return false;
  }
}

const char* reduce_name(int reduce) {
  switch (reduce) {
    case 0:
      return "sum";
    case 1:
      return "average";
    case 2:
      return "max";
    default:
      return "?";
  }
}

}  // namespace

CollectiveFingerprint::CollectiveFingerprint(std::int64_t seq_, const char* operation_, std::int64_t count_,
                                             DType dtype_, int root_, int reduce_, int bucket_, int buckets_,
                                             std::int64_t step_)
    : seq(seq_), count(count_), dtype(static_cast<std::int32_t>(dtype_)), root(root_), reduce(reduce_),
      bucket(bucket_), buckets(buckets_), step(step_) {
  std::snprintf(operation, sizeof operation, "%s", operation_);
}

bool CollectiveFingerprint::same_collective(const CollectiveFingerprint& o) const {
  return std::strncmp(operation, o.operation, sizeof operation) == 0 && count == o.count && dtype == o.dtype &&
         root == o.root && reduce == o.reduce;
}

std::string CollectiveFingerprint::text() const {
  std::string s = operation;
  if (count > 0) s += " of " + std::to_string(count) + " " + dtype_name(static_cast<DType>(dtype)) + " elements";
  if (root >= 0) s += " (root " + std::to_string(root) + ")";
  if (reduce >= 0) s += std::string(" (") + reduce_name(reduce) + ")";
  if (bucket >= 0) s += ", bucket " + std::to_string(bucket) + " of " + std::to_string(buckets);
  return s + ", step " + std::to_string(step);
}

std::string start_collective_mismatch(MPI_Comm comm) {
  std::string error;
  const bool requested = debug_collectives_requested(&error);
  int flags[2] = {requested ? 1 : 0, error.empty() ? 0 : 1};
  DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, comm));
  if (flags[1]) return error.empty() ? "DDP_DEBUG names a mode this runtime does not know on another rank" : error;
  if (!flags[0]) return "";
  CheckState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.comm != MPI_COMM_NULL) return "";  // a second World of this process: the first one's check goes on
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &s.comm));
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
  DDP_MPI_CHECK(MPI_Comm_size(s.comm, &s.size));
  s.failure.clear();
  s.enabled.store(true);
  return "";
}

void stop_collective_mismatch() {
  CheckState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.enabled.store(false);
  if (s.comm != MPI_COMM_NULL) MPI_Comm_free(&s.comm);
}

bool collective_mismatch_enabled() { return state().enabled.load(std::memory_order_relaxed); }

std::string check_collective(const CollectiveFingerprint& mine) {
  CheckState& s = state();
  if (!s.enabled.load(std::memory_order_relaxed)) return "";
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.failure.empty() || s.comm == MPI_COMM_NULL) return s.failure;
  std::vector<CollectiveFingerprint> all(static_cast<std::size_t>(s.size));
  MPI_Request request = MPI_REQUEST_NULL;
  DDP_MPI_CHECK(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, s.comm, &request));
  wait_within_deadline(&request, [&] {
    return "rank " + std::to_string(s.rank) + "'s DDP_DEBUG=collectives comparison before #" +
           std::to_string(mine.seq) + " (" + mine.text() + ")";
  });

  // Ranks that issue the same collective form one side; the smaller sides (the odd ones out) come first.
  std::vector<std::pair<const CollectiveFingerprint*, std::vector<int>>> sides;
  for (int r = 0; r < s.size; ++r) {
    auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& x) { return x.first->same_collective(all[r]); });
    if (side == sides.end()) {
      sides.emplace_back(&all[r], std::vector<int>{r});
    } else {
      side->second.push_back(r);
    }
  }
  if (sides.size() == 1) return "";
  std::stable_sort(sides.begin(), sides.end(), [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  std::string message = "collective #" + std::to_string(mine.seq) + " differs across ranks (DDP_DEBUG=collectives):";
  for (const auto& [what, ranks] : sides) {
    message += std::string("\n  rank") + (ranks.size() == 1 ? " " : "s ") + rank_list(ranks) + ": " + what->text();
  }
  s.failure = message;
  return message;
}

}  // namespace ddp
