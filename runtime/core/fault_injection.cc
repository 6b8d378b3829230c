#include "runtime/core/fault_injection.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/core/settings.h"

namespace ddp {
namespace {

// The phases as DDP_FAULT_STALL names them, in the order of enum Phase.
constexpr const char* kTokens[kPhaseCount] = {"user",      "data",       "forward",   "backward",
                                              "optimizer", "checkpoint", "evaluation"};

struct StallInjection {
  bool armed = false;
  int rank = 0;
  Phase phase = Phase::kUserCode;
  std::int64_t step = 0;
  bool stop = false;
  double pause_s = 0;  // > 0: pause this long, then go on
};

StallInjection parse_stall_injection() {
  StallInjection s;
  const std::string text = settings::text(settings::setting("DDP_FAULT_STALL"));
  if (text.empty()) return s;
  const char* env = text.c_str();
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank_env == nullptr) rank_env = std::getenv("PMIX_RANK");
  const int rank = rank_env != nullptr ? std::atoi(rank_env) : 0;
  int want_rank = -1;
  long long step = 0;
  char phase[32] = {0};
  char how[16] = {0};
  const int fields = std::sscanf(env, "%d:%31[a-z]:%lld:%15s", &want_rank, phase, &step, how);
  bool known = false;
  for (int p = 0; p < kPhaseCount; ++p) {
    if (std::strcmp(phase, kTokens[p]) == 0) {
      s.phase = static_cast<Phase>(p);
      known = true;
    }
  }
  char* end = nullptr;
  const double pause_s = fields == 4 ? std::strtod(how, &end) : 0.0;
  const bool pauses = fields == 4 && end != how && *end == '\0' && pause_s > 0;
  if (fields < 3 || !known || (fields == 4 && std::strcmp(how, "stop") != 0 && !pauses)) {
    std::fprintf(stderr, "DDP_FAULT_STALL=%s: expected RANK:PHASE:STEP[:stop|:SECONDS] with PHASE one of user, data, "
                 "forward, backward, optimizer, checkpoint, evaluation; ignored\n", env);
    return s;
  }
  s.armed = want_rank == rank;
  s.rank = rank;
  s.step = step;
  s.stop = fields == 4 && !pauses;
  s.pause_s = pauses ? pause_s : 0.0;
  return s;
}

}  // namespace

void maybe_inject_stall(Phase phase) {
  static const StallInjection injection = parse_stall_injection();
  static std::atomic<bool> fired{false};
  if (!injection.armed || phase != injection.phase || current_step() < injection.step || fired.exchange(true)) {
    return;
  }
  if (injection.pause_s > 0) {
    std::fprintf(stderr, "rank %d: fault injection (DDP_FAULT_STALL): pausing %g s in %s at step %lld\n",
                 injection.rank, injection.pause_s, phase_name(phase), static_cast<long long>(current_step()));
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(injection.pause_s));
    return;
  }
  std::fprintf(stderr, "rank %d: fault injection (DDP_FAULT_STALL): %s in %s at step %lld\n", injection.rank,
               injection.stop ? "stopping (SIGSTOP)" : "stalling", phase_name(phase),
               static_cast<long long>(current_step()));
  std::fflush(stderr);
  if (injection.stop) std::raise(SIGSTOP);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace ddp
