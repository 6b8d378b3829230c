// The explanation of a hang, from every rank's flight recorder: which ranks are behind (they have not issued the
// collective the others wait in) and where they are (their last collective, their phase and for how long),
// which ranks could not answer, and what the others wait in. Like PyTorch's flight-recorder analysis, it looks
// for the first collective some rank waits in; unlike it, it runs inside the job, so the message the job ends
// with says it:
//   rank 2 is behind: last collective #812 (MPI_Allreduce of 4160 float32, bucket 3 of 4, step 41), in data
//   loading for 302 s; ranks 0,1,3 wait in #813 (MPI_Allreduce of 4160 float32, bucket 0 of 4, step 42)
#pragma once

#include <string>
#include <vector>

#include "runtime/distributed/hang_diagnosis/flight_recorder.h"

namespace ddp {

// One line (no newline) from the states of every rank of the job, in rank order.
std::string explain_stall(const std::vector<RankState>& ranks);

// "3", "0,1,2", "0-5,7": ascending ranks, runs of four or more as ranges.
std::string rank_list(std::vector<int> ranks);

}  // namespace ddp
