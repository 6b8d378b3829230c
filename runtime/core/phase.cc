#include "runtime/core/phase.h"

#include <atomic>
#include <chrono>
#include <cstring>

#include "runtime/core/check.h"
#include "runtime/core/fault_injection.h"
#include "runtime/core/settings.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kNames[kPhaseCount] = {"user code",      "data loading",   "forward",   "backward",
                                             "optimizer step", "checkpoint I/O", "evaluation"};

// DDP_FLIGHT_RECORDER (runtime/core/settings.h). A malformed value keeps the default here: the first collective
// refuses it on every rank (settings::environment_errors).
bool enabled_from_environment() {
  try {
    return settings::flag(settings::setting("DDP_FLIGHT_RECORDER"));
  } catch (const InvalidArgument&) {
    return true;
  }
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

}  // namespace

const char* phase_name(Phase phase) {
  const int p = static_cast<int>(phase);
  return p >= 0 && p < kPhaseCount ? kNames[p] : "unknown phase";
}

bool parse_phase_name(const char* name, Phase* phase) {
  for (int p = 0; p < kPhaseCount; ++p) {
    if (std::strcmp(name, kNames[p]) == 0) {
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
