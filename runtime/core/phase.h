// What the training thread is doing now (loading data, forward, backward, the optimizer step, a checkpoint, an
// evaluation, or the program's own code) and since when, so that a hang can say where a rank is: "rank 2 is
// in data loading for 302 s". The runtime marks its own phases (the batch loader and the resident data set's
// gather, a Sequential's forward, DDP's backward, the optimizer step, checkpoint files); a program marks what
// only it knows, an evaluation for instance, with a PhaseGuard. Outside every phase a rank is in "user code".
//
// It lives in the lowest layer because the layers that mark phases (optim, io, models) sit below the
// distributed layer that reports them. It is cheap enough to stay on (two clock reads and a few relaxed
// stores per phase); set_flight_recorder_enabled(false), or DDP_FLIGHT_RECORDER=0, turns it off together with
// the record of collectives.
//
// Phases nest (a forward inside an evaluation); entering the phase the thread is already in is a no-op. Only
// the thread that marked a phase first (the training thread) is followed: guards on other threads do nothing.
#pragma once

#include <chrono>
#include <cstdint>

namespace ddp {

enum class Phase : std::uint8_t { kUserCode, kData, kForward, kBackward, kOptimizer, kCheckpoint, kEvaluation };
constexpr int kPhaseCount = 7;

// "user code", "data loading", "forward", "backward", "optimizer step", "checkpoint I/O", "evaluation".
const char* phase_name(Phase phase);
// The inverse of phase_name; false when `name` is none of them.
bool parse_phase_name(const char* name, Phase* phase);

// The phases and the record of collectives (runtime/distributed/hang_diagnosis/flight_recorder.h) are kept while
// enabled: by default, unless DDP_FLIGHT_RECORDER=0. Switching at run time is for measuring what they cost.
bool flight_recorder_enabled();
void set_flight_recorder_enabled(bool enabled);

// Marks the training thread as in `phase` for the guard's lifetime.
//   { ddp::PhaseGuard evaluating(ddp::Phase::kEvaluation); ...evaluate... }
class PhaseGuard {
 public:
  explicit PhaseGuard(Phase phase) noexcept;
  ~PhaseGuard();
  PhaseGuard(const PhaseGuard&) = delete;
  PhaseGuard& operator=(const PhaseGuard&) = delete;

 private:
  bool entered_ = false;
};

// The training step the rank is at: DDP backward passes begun so far (the reducer sets it). Messages name
// collectives and phases by it.
void set_current_step(std::int64_t step) noexcept;
std::int64_t current_step() noexcept;

// The phases the training thread is in, outermost first (depth 1: user code only), each with the time it was
// entered, or, for an outer phase, resumed when its inner phase ended. Safe to take from any thread.
struct PhaseSnapshot {
  static constexpr int kMaxDepth = 8;
  int depth = 1;
  Phase phases[kMaxDepth] = {};
  std::chrono::steady_clock::time_point since[kMaxDepth] = {};
  std::int64_t step = 0;
};
PhaseSnapshot phase_snapshot();

}  // namespace ddp
