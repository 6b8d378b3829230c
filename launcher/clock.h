// The two clocks of the launcher: CLOCK_REALTIME, which the rank wrappers' exit markers carry so that ddprun
// can order exits of processes it did not start, and CLOCK_MONOTONIC for its own deadlines.
#pragma once

#include <time.h>

namespace ddp {
namespace launcher {

inline long long realtime_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

inline long long monotonic_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000LL + now.tv_nsec / 1000000;
}

}  // namespace launcher
}  // namespace ddp
