// Fault injection for the reliability tests (see fault_injection.h).
#include "runtime/training/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"

namespace ddp::training {

void maybe_inject_fault(long long step, int rank) {
  static const std::int64_t at = settings::integer(settings::setting("DDP_FAULT_KILL_STEP"));
  if (at < 0 || at != step) return;
  const std::int64_t who = settings::integer(settings::setting("DDP_FAULT_KILL_RANK"));
  if ((who >= 0 && who != rank) || settings::integer(settings::setting("DDP_RESTART")) > 0) return;
  const std::string stamp = settings::text(settings::setting("DDP_FAULT_KILL_STAMP"));
  if (!stamp.empty()) {
    if (FILE* f = std::fopen(stamp.c_str(), "w")) {
      std::fprintf(f, "%.3f\n",
                   std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
      std::fclose(f);
    }
  }
  if (settings::text(settings::setting("DDP_FAULT_KIND")) == "throw") {
    throw Error("fault injection: an error on rank " + std::to_string(rank) + " alone after step " +
                std::to_string(step));
  }
  std::fprintf(stderr, "rank %d: fault injection: SIGKILL after step %lld\n", rank, step);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace ddp::training
