#include "runtime/core/phase.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

struct PhaseNames {
  const char* token;  // in DDP_FAULT_STALL
  const char* display;
};
constexpr PhaseNames kNames[kPhaseCount] = {
    {"user", "user code"},         {"data", "data loading"},  {"forward", "forward"},
    {"backward", "backward"},      {"optimizer", "optimizer step"}, {"checkpoint", "checkpoint I/O"},
    {"evaluation", "evaluation"},
};

bool enabled_from_environment() {
  const char* env = std::getenv("DDP_FLIGHT_RECORDER");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

// Written by the training thread only; read by any thread (a dump, a stall report). Every field is atomic so
// that a reader racing a write gets a value that was true a moment ago, never undefined behaviour.
struct PhaseStack {
  std::atomic<bool> enabled{enabled_from_environment()};
  std::atomic<bool> claimed{false};  // some thread has become the training thread
  std::atomic<int> depth{1};
  std::atomic<std::uint8_t> phases[PhaseSnapshot::kMaxDepth] = {};
  std::atomic<Clock::rep> since[PhaseSnapshot::kMaxDepth] = {};
  std::atomic<std::int64_t> step{0};
  PhaseStack() { since[0].store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
};

PhaseStack& stack() {
  static PhaseStack s;
  return s;
}

// Whether the calling thread is the training thread: the first thread to enter a phase becomes it.
bool on_training_thread() {
  thread_local int role = 0;  // 0: not asked yet, 1: the training thread, 2: another thread
  if (role == 0) {
    bool expected = false;
    role = stack().claimed.compare_exchange_strong(expected, true) ? 1 : 2;
  }
  return role == 1;
}

// DDP_FAULT_STALL=RANK:PHASE:STEP[:stop|:SECONDS], a test seam: rank RANK (OMPI_COMM_WORLD_RANK) stops making
// progress the first time it enters PHASE (user, data, forward, backward, optimizer, checkpoint, evaluation; user
// code is entered when the outermost phase ends) at step STEP or later: it sleeps until the job is ended, or
// with ":stop" stops itself (SIGSTOP), as a rank that can no longer answer. The tests of the stall report inject
// their hangs with it. With a number of SECONDS instead it pauses that long and goes on: the graceful stop's
// tests signal the job while a rank is inside PHASE.
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
  const char* env = std::getenv("DDP_FAULT_STALL");
  if (env == nullptr || *env == '\0') return s;
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
    if (std::strcmp(phase, kNames[p].token) == 0) {
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

}  // namespace

const char* phase_name(Phase phase) {
  const int p = static_cast<int>(phase);
  return p >= 0 && p < kPhaseCount ? kNames[p].display : "unknown phase";
}

bool parse_phase_name(const char* name, Phase* phase) {
  for (int p = 0; p < kPhaseCount; ++p) {
    if (std::strcmp(name, kNames[p].display) == 0) {
      *phase = static_cast<Phase>(p);
      return true;
    }
  }
  return false;
}

bool flight_recorder_enabled() { return stack().enabled.load(std::memory_order_relaxed); }
void set_flight_recorder_enabled(bool enabled) { stack().enabled.store(enabled, std::memory_order_relaxed); }

PhaseGuard::PhaseGuard(Phase phase) noexcept {
  PhaseStack& s = stack();
  if (!s.enabled.load(std::memory_order_relaxed) || !on_training_thread()) return;
  const int depth = s.depth.load(std::memory_order_relaxed);
  if (depth >= PhaseSnapshot::kMaxDepth ||
      s.phases[depth - 1].load(std::memory_order_relaxed) == static_cast<std::uint8_t>(phase)) {
    return;  // already in it (a Sequential inside a Sequential), or nested deeper than anyone reads
  }
  s.phases[depth].store(static_cast<std::uint8_t>(phase), std::memory_order_relaxed);
  s.since[depth].store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  s.depth.store(depth + 1, std::memory_order_release);
  entered_ = true;
  maybe_inject_stall(phase);
}

PhaseGuard::~PhaseGuard() {
  if (!entered_) return;
  PhaseStack& s = stack();
  const int depth = s.depth.load(std::memory_order_relaxed) - 1;
  // The outer phase resumes now: how long a rank has been in it counts from here.
  s.since[depth - 1].store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  s.depth.store(depth, std::memory_order_release);
  if (depth == 1) maybe_inject_stall(Phase::kUserCode);
}

void set_current_step(std::int64_t step) noexcept { stack().step.store(step, std::memory_order_relaxed); }
std::int64_t current_step() noexcept { return stack().step.load(std::memory_order_relaxed); }

PhaseSnapshot phase_snapshot() {
  const PhaseStack& s = stack();
  PhaseSnapshot snapshot;
  snapshot.depth = s.depth.load(std::memory_order_acquire);
  for (int d = 0; d < snapshot.depth; ++d) {
    snapshot.phases[d] = static_cast<Phase>(s.phases[d].load(std::memory_order_relaxed));
    snapshot.since[d] = Clock::time_point(Clock::duration(s.since[d].load(std::memory_order_relaxed)));
  }
  snapshot.step = s.step.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace ddp
