// BucketOptimizerShard: the owned slices, the per-bucket in-place all-gathers of the updated parameters, and the
// host collectives over the shards.
#include "runtime/distributed/bucket_optimizer_shard.h"

#include <algorithm>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/world_mpi.h"

namespace ddp {

BucketOptimizerShard::BucketOptimizerShard(ProcessGroup& group, const World& world, BucketPlan plan,
                                     CommBuffer parameters, const Stream& compute)
    : group_(group), plan_(std::move(plan)), parameters_(parameters), rank_(group.rank()), size_(group.size()) {
  DDP_CHECK(plan_.shards == size_, "BucketOptimizerShard: the bucket plan is made for " + std::to_string(plan_.shards) +
                                      " shards, the group has " + std::to_string(size_) + " ranks");
  DDP_CHECK(parameters.count == plan_.total && parameters.dtype == DType::kFloat32,
            "BucketOptimizerShard: the flat parameter buffer must be the plan's " + std::to_string(plan_.total) +
                " float32 elements");
  run_host_collective("MPI_Comm_idup (making the optimizer shard's communicator)", 0, DType::kUInt8,
                      [&](MPI_Request* request) { return MPI_Comm_idup(mpi_comm(world), &comm_, request); });
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  owned_.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) owned_[r].push_back(plan_.shard_of(b, r));
  }
  works_.assign(plan_.buckets.size(), nullptr);
  if (compute.device().is_cuda()) {
    waits_begin_ = Event::create(compute.device(), /*timing=*/true);
    waits_end_ = Event::create(compute.device(), /*timing=*/true);
  }
}

BucketOptimizerShard::~BucketOptimizerShard() {
  // All-gathers in flight write the parameter buffer: let them finish before it can go away.
  for (auto& w : works_) {
    if (!w) continue;
    try {
      w->synchronize();
    } catch (...) {
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);  // an optimizer that outlived the World may hold the last reference
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

const std::vector<FlatSpan>& BucketOptimizerShard::owned(int rank) const {
  DDP_CHECK(rank >= 0 && rank < size_, "BucketOptimizerShard: no rank " + std::to_string(rank));
  return owned_[static_cast<std::size_t>(rank)];
}

void BucketOptimizerShard::span_updated(std::size_t k, const Stream& stream) {
  DDP_ASSERT(k < plan_.buckets.size(), "span_updated: no bucket " + std::to_string(k));
  if (k == 0) {
    ++steps_;
    stats_ = GatherStats{};  // a captured step leaves them untimed
    stats_pending_ = false;
  }
  const GradientBucket& bucket = plan_.buckets[k];
  CommBuffer whole = parameters_;
  whole.data = static_cast<float*>(parameters_.data) + bucket.offset;
  whole.count = bucket.count;
  CommBuffer mine = parameters_;
  mine.data = static_cast<float*>(parameters_.data) + owned_[rank_][k].offset;
  mine.count = owned_[rank_][k].count;
  CollectiveContext context{static_cast<int>(k), static_cast<int>(plan_.buckets.size()), whole.bytes(), steps_};
  context.phase = "optimizer step";
  group_.set_context(context);
  works_[k] = group_.all_gather(mine, whole, stream);
}

void BucketOptimizerShard::finish_update(const Stream& stream) {
  const bool captured = is_capturing(stream);
  const bool cuda = stream.device().is_cuda();
  if (cuda && !captured) waits_begin_.record(stream);
  const auto wait_start = std::chrono::steady_clock::now();
  for (auto& w : works_) {
    DDP_ASSERT(w != nullptr, "finish_update before every bucket's span_updated");
    w->wait(stream);
  }
  if (captured) return;  // no timings: see GatherStats::timed
  if (cuda) {
    waits_end_.record(stream);
  } else {
    stats_.exposed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wait_start).count();
  }
  stats_pending_ = true;
}

const GatherStats& BucketOptimizerShard::last_stats() {
  if (!stats_pending_) return stats_;
  stats_pending_ = false;
  stats_.timed = true;
  if (waits_end_.handle() != nullptr) {
    waits_end_.synchronize();
    stats_.exposed_ms = waits_end_.elapsed_ms_since(waits_begin_);
  }
  stats_.gather_ms = 0;
  for (auto& w : works_) {
    if (w) stats_.gather_ms += std::max(0.0, w->duration_ms());
  }
  return stats_;
}

double BucketOptimizerShard::sum(double value) {
  std::vector<double> all(static_cast<std::size_t>(size_));
  run_host_collective("BucketOptimizerShard::sum", size_, DType::kFloat64, [&](MPI_Request* request) {
    return MPI_Iallgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_, request);
  });
  double total = 0.0;
  for (double v : all) total += v;  // rank order, the same on every rank
  return total;
}

void BucketOptimizerShard::gather_to_first(FlatSpan range, const float* local, float* out) {
  DDP_CHECK(range.offset >= 0 && range.end() <= plan_.total && range.count <= INT32_MAX,
            "gather_to_first: elements [" + std::to_string(range.offset) + ", " + std::to_string(range.end()) +
                ") are not a range of the flat buffer, or too many for one MPI call");
  // Rank-major on the wire; rank 0 then puts every piece where it belongs in the range.
  std::vector<int> counts(static_cast<std::size_t>(size_), 0), displacements(static_cast<std::size_t>(size_), 0);
  int placed = 0;
  for (int r = 0; r < size_; ++r) {
    for (const FlatSpan& piece : intersect(owned_[r], range)) counts[r] += static_cast<int>(piece.count);
    displacements[r] = placed;
    placed += counts[r];
  }
  DDP_ASSERT(placed == range.count, "the shards do not cover the range");
  std::vector<float> wire(rank_ == 0 ? static_cast<std::size_t>(range.count) : 0);
  // Under the deadline and in the flight recorder: a rank 0 stuck writing the file must not leave the others
  // waiting here without a report.
  run_host_collective("BucketOptimizerShard::gather", range.count, DType::kFloat32, [&](MPI_Request* request) {
    return MPI_Igatherv(local, counts[rank_], MPI_FLOAT, wire.data(), counts.data(), displacements.data(), MPI_FLOAT,
                        0, comm_, request);
  });
  if (rank_ != 0) return;
  for (int r = 0; r < size_; ++r) {
    const float* from = wire.data() + displacements[r];
    for (const FlatSpan& piece : intersect(owned_[r], range)) {
      std::copy(from, from + piece.count, out + (piece.offset - range.offset));
      from += piece.count;
    }
  }
}

}  // namespace ddp
