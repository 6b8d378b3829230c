// Fault injection for the reliability tests (see fault_injection.h).
#include "runtime/training/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/core/check.h"

namespace ddp::training {

void maybe_inject_fault(long long step, int rank) {
  static const char* at = std::getenv("DDP_FAULT_KILL_STEP");
  if (at == nullptr) return;
  const char* who = std::getenv("DDP_FAULT_KILL_RANK");
  const char* restart = std::getenv("DDP_RESTART");
  if (std::atoll(at) != step || (who != nullptr && std::atoi(who) != rank)) return;
  if (restart != nullptr && std::atoi(restart) > 0) return;
  if (const char* stamp = std::getenv("DDP_FAULT_KILL_STAMP")) {
    if (FILE* f = std::fopen(stamp, "w")) {
      std::fprintf(f, "%.3f\n",
                   std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
      std::fclose(f);
    }
  }
  const char* kind = std::getenv("DDP_FAULT_KIND");
  if (kind != nullptr && std::string(kind) == "throw") {
    throw Error("fault injection: an error on rank " + std::to_string(rank) + " alone after step " +
                std::to_string(step));
  }
  std::fprintf(stderr, "rank %d: fault injection: SIGKILL after step %lld\n", rank, step);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

}  // namespace ddp::training
