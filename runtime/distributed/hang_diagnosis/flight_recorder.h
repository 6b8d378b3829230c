// The flight recorder: this rank's recent collectives (sequence number, operation, element count and type,
// bucket, step, when it was issued and when it completed) in a fixed ring, plus the phase the rank is in
// (runtime/core/phase.h). When a job hangs, the ranks' records say which rank is behind and where: the watchdog
// gathers them over the side channel (side_channel.h) and stall_report.h compares them; SIGUSR2 prints them.
//
// Sequence numbers count this process's collectives in the order they are issued, process groups and the
// World's host collectives alike. Every rank issues the same collectives in the same order, so #813 names the
// same collective on every rank. Recording one is a lock, a clock read and a few stores into a slot allocated
// once: cheap enough to stay on (DDP_FLIGHT_RECORDER=0 turns it off with the phases; sequence numbers go on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/phase.h"

namespace ddp {

// Records that this rank issues a collective; returns its sequence number (from 1). `operation` must be a
// string literal ("MPI_Allreduce", "ncclAllReduce", "World::agree", ...); `bucket` is -1 for a collective that
// is not a gradient bucket's.
std::int64_t record_collective_issued(const char* operation, std::int64_t count, DType dtype, int bucket,
                                      int buckets, std::int64_t step);
// Records that collective `seq` completed on this rank (the first call counts; later ones do nothing, as do
// calls for a collective the ring no longer holds).
void record_collective_completed(std::int64_t seq);

// A collective as a rank reports it: times are ages at the moment of the report, so that ranks on hosts whose
// clocks differ can be compared.
struct CollectiveState {
  std::int64_t seq = 0;
  std::string operation;
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  int bucket = -1;
  int buckets = 0;
  std::int64_t step = 0;
  double issued_s_ago = 0;
  double completed_s_ago = -1;  // negative: still in flight

  bool completed() const { return completed_s_ago >= 0; }
  // "MPI_Allreduce of 4160 float32, bucket 0 of 4, step 42"
  std::string text() const;
  // Same operation, element count and type: what every rank must issue as one collective.
  bool same_collective(const CollectiveState& other) const;
};

struct PhaseState {
  Phase phase = Phase::kUserCode;
  double for_s = 0;  // since the rank entered it (or, for an outer phase, came back to it)
};

// What a rank reports about itself, or what is known about a rank that could not report.
struct RankState {
  int rank = -1;        // in the session's communicator
  int world_rank = -1;  // in MPI_COMM_WORLD (ddprun's and mpirun's numbering), when known
  bool answered = false;
  std::string no_answer;  // why it did not, when it did not
  bool reporting = false;  // it is making the report of a hang (side_channel.h)
  std::string host;
  long long pid = 0;
  std::int64_t step = 0;
  std::vector<PhaseState> phases;             // outermost first: the last is what the rank is doing
  std::vector<CollectiveState> collectives;  // oldest first

  // The last collective it issued and the oldest one still in flight; null when there is none.
  const CollectiveState* last_issued() const;
  const CollectiveState* oldest_in_flight() const;
  const CollectiveState* find(std::int64_t seq) const;
  // "in data loading for 302 s", "in forward for 1.2 s, within evaluation"
  std::string phase_text() const;
};

// This process's state as rank `rank`: the phases and the last `max_collectives` collectives (every collective
// still in flight is kept even beyond that).
RankState local_rank_state(int rank, std::size_t max_collectives);

// The state as lines for a person, each starting "rank R: ", the last collectives last:
//   rank 2: flight recorder: in data loading for 12 s, step 41, pid 4242 on node1
//   rank 2:   #812 MPI_Allreduce of 4160 float32, bucket 0 of 1, step 41: issued 12 s ago, took 0.4 ms
std::string format_rank_state(const RankState& state);

// "2.1 s" below ten seconds, "302 s" above.
std::string format_seconds(double seconds);

}  // namespace ddp
