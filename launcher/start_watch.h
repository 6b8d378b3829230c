// ddprun's watch over the ranks' start. A rank stopped or stuck before it gets through MPI_Init leaves the others
// inside MPI_Init, which has no deadline of its own: the job would sit there until killed, without a word. Each
// rank's runtime tells ddprun when it begins MPI_Init and when it is through (runtime/core/start_marker.h); once
// the first rank has begun, every rank must be through within the collective deadline (DDP_COLLECTIVE_TIMEOUT_S,
// at least 10 s, counted in running time), else ddprun names the ranks that are not and ends the job. A program
// whose runtime does not start MPI itself (an MPI application's) says nothing, and is not watched.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "runtime/core/deadline.h"
#include "runtime/core/start_marker.h"

namespace ddp {
namespace launcher {

class StartWatch {
 public:
  // `ranks`: the job's world size; `timeout_s`: the deadline from the first rank's start.
  StartWatch(int ranks, double timeout_s) : ranks_(ranks), timeout_s_(timeout_s) {}

  void observe(const StartMarker& marker);
  // Whether the watch is running: a rank has begun and not every rank is through.
  bool waiting() const { return deadline_.has_value() && static_cast<int>(ready_.size()) < ranks_; }
  // Once the deadline has passed with a rank not through: the message (once; empty afterwards and before).
  std::string overdue();
  // The lowest rank that never began MPI_Init, else the lowest that is not through it; empty before overdue().
  std::optional<int> late_rank() const { return late_rank_; }

 private:
  int ranks_;
  double timeout_s_;
  std::optional<Deadline> deadline_;
  int first_rank_ = -1;
  std::set<int> begun_;
  std::set<int> ready_;
  bool reported_ = false;
  std::optional<int> late_rank_;
};

// Ranks start MPI some time apart (each loads its program and libraries first; more ranks than cores share them):
// a deadline shorter than this would take a slow start for a stuck one.
inline constexpr double kMinStartTimeoutS = 10.0;

// The watch's deadline: DDP_COLLECTIVE_TIMEOUT_S (300 s when unset or malformed: the ranks refuse a malformed one
// themselves, with a message of their own), at least kMinStartTimeoutS.
double start_timeout_s();

}  // namespace launcher
}  // namespace ddp
