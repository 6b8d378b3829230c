#include "runtime/distributed/hang_diagnosis/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// Enough for every bucket of several steps and the host collectives between them; a hang is explained by the
// last few.
constexpr std::size_t kRingSlots = 256;

struct Slot {
  std::int64_t seq = 0;  // 0: empty
  const char* operation = "";
  std::int64_t count = 0;
  DType dtype = DType::kFloat32;
  int bucket = -1;
  int buckets = 0;
  std::int64_t step = 0;
  Clock::time_point issued{};
  Clock::time_point completed{};  // epoch: not yet
};

// The issuing thread writes a slot, a communication or watchdog thread completes it, a dump reads them all: a
// mutex that is almost never contended keeps that simple.
struct Ring {
  std::atomic<std::int64_t> last_seq{0};
  std::mutex mutex;
  Slot slots[kRingSlots];
};

Ring& ring() {
  static Ring r;
  return r;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

std::int64_t record_collective_issued(const char* operation, std::int64_t count, DType dtype, int bucket,
                                      int buckets, std::int64_t step) {
  Ring& r = ring();
  const std::int64_t seq = r.last_seq.fetch_add(1, std::memory_order_relaxed) + 1;
  if (!flight_recorder_enabled()) return seq;
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.slots[seq % kRingSlots] = Slot{seq, operation, count, dtype, bucket, buckets, step, now, Clock::time_point{}};
  return seq;
}

void record_collective_completed(std::int64_t seq) {
  // Even when off: a collective recorded before the switch must not look in flight for ever.
  if (seq <= 0) return;
  Ring& r = ring();
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  Slot& slot = r.slots[seq % kRingSlots];
  if (slot.seq == seq && slot.completed == Clock::time_point{}) slot.completed = now;
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds < 10) {
    std::snprintf(text, sizeof text, "%.1f s", std::max(0.0, seconds));
  } else {
    std::snprintf(text, sizeof text, "%.0f s", seconds);
  }
  return text;
}

std::string CollectiveState::text() const {
  std::string s = operation;
  if (count > 0) s += " of " + std::to_string(count) + " " + dtype_name(dtype);
  if (bucket >= 0) s += ", bucket " + std::to_string(bucket) + " of " + std::to_string(buckets);
  s += ", step " + std::to_string(step);
  return s;
}

bool CollectiveState::same_collective(const CollectiveState& other) const {
  return operation == other.operation && count == other.count && dtype == other.dtype;
}

const CollectiveState* RankState::last_issued() const { return collectives.empty() ? nullptr : &collectives.back(); }

const CollectiveState* RankState::oldest_in_flight() const {
  for (const CollectiveState& c : collectives) {
    if (!c.completed()) return &c;
  }
  return nullptr;
}

const CollectiveState* RankState::find(std::int64_t seq) const {
  for (const CollectiveState& c : collectives) {
    if (c.seq == seq) return &c;
  }
  return nullptr;
}

std::string RankState::phase_text() const {
  if (phases.empty()) return "in an unknown phase";
  std::string s = std::string("in ") + phase_name(phases.back().phase) + " for " + format_seconds(phases.back().for_s);
  for (std::size_t k = phases.size() - 1; k-- > 1;) s += std::string(", within ") + phase_name(phases[k].phase);
  return s;
}

RankState local_rank_state(int rank, std::size_t max_collectives) {
  RankState state;
  state.rank = rank;
  state.answered = true;
  state.pid = static_cast<long long>(::getpid());
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) state.host = host;

  const PhaseSnapshot phases = phase_snapshot();
  const Clock::time_point now = Clock::now();
  state.step = phases.step;
  for (int d = 0; d < phases.depth; ++d) {
    state.phases.push_back(PhaseState{phases.phases[d], seconds_between(phases.since[d], now)});
  }

  std::vector<Slot> slots;
  {
    Ring& r = ring();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const Slot& s : r.slots) {
      if (s.seq > 0) slots.push_back(s);
    }
  }
  std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.seq < b.seq; });
  const std::size_t first_kept = slots.size() > max_collectives ? slots.size() - max_collectives : 0;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const Slot& s = slots[k];
    const bool in_flight = s.completed == Clock::time_point{};
    if (k < first_kept && !in_flight) continue;
    CollectiveState c;
    c.seq = s.seq;
    c.operation = s.operation;
    c.count = s.count;
    c.dtype = s.dtype;
    c.bucket = s.bucket;
    c.buckets = s.buckets;
    c.step = s.step;
    c.issued_s_ago = seconds_between(s.issued, now);
    c.completed_s_ago = in_flight ? -1.0 : seconds_between(s.completed, now);
    state.collectives.push_back(std::move(c));
  }
  return state;
}

std::string format_rank_state(const RankState& state) {
  const std::string prefix = "rank " + std::to_string(state.rank) + ": ";
  std::string text = prefix + "flight recorder: " + state.phase_text() + ", step " + std::to_string(state.step) +
                     ", pid " + std::to_string(state.pid) + " on " + state.host;
  if (state.collectives.empty()) text += "; no collective recorded";
  text += "\n";
  for (const CollectiveState& c : state.collectives) {
    text += prefix + "  #" + std::to_string(c.seq) + " " + c.text() + ": issued " + format_seconds(c.issued_s_ago) +
            " ago, ";
    if (c.completed()) {
      char took[32];
      std::snprintf(took, sizeof took, "took %.3f ms", 1000.0 * (c.issued_s_ago - c.completed_s_ago));
      text += took;
    } else {
      text += "in flight";
    }
    text += "\n";
  }
  return text;
}

}  // namespace ddp
