// Stop requests: a flag set by the first signal, the default action restored for the second.
#include "runtime/core/stop_request.h"

#include <time.h>

#include <atomic>
#include <csignal>
#include <mutex>

namespace ddp {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_stopping{false};
std::atomic<long long> g_requested_at_ns{0};  // CLOCK_MONOTONIC

long long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};

// A signal this soon after the first is the same stop come by another route, not a second request: Slurm
// signals every process of a job at once (at a time limit, on scancel), so a rank gets its SIGTERM directly
// and again through its launcher (ddprun's rank wrapper) a few milliseconds later. A user who insists takes
// longer than this between two Ctrl-Cs.
constexpr long long kSameStopWindowNs = 1000000000LL;

void on_stop_signal(int signal) {
  const long long now = monotonic_ns();
  if (signal == SIGUSR1 && g_stop_requested.load()) return;  // the same request again (ddprun's, after the user's)
  if (g_stop_requested.exchange(true)) {
    if (now - g_requested_at_ns.load() < kSameStopWindowNs) return;
    // The second signal: what it would have done without us (end the process), now.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  g_requested_at_ns.store(now);
  g_stop_signal.store(signal);
}

}  // namespace

void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int signal : kStopSignals) {
      struct sigaction previous {};
      if (sigaction(signal, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
      struct sigaction action {};
      action.sa_handler = on_stop_signal;
      // The stop signals wait for each other's handler: the first records its time before a second reads it.
      sigemptyset(&action.sa_mask);
      for (int blocked : kStopSignals) sigaddset(&action.sa_mask, blocked);
      action.sa_flags = SA_RESTART;  // a checkpoint write in progress goes on instead of failing with EINTR
      sigaction(signal, &action, nullptr);
    }
  });
}

bool stop_requested() { return g_stop_requested.load(); }

int stop_signal() { return g_stop_signal.load(); }

void clear_stop_request() {
  g_stopping.store(false);
  g_stop_requested.store(false);
  g_stop_signal.store(0);
  g_requested_at_ns.store(0);
}

void request_stop() {
  if (!g_stop_requested.exchange(true)) g_requested_at_ns.store(monotonic_ns());
}

void note_stopping() { g_stopping.store(true); }

bool stopping() { return g_stopping.load() || g_stop_requested.load(); }

double seconds_since_stop_request() {
  const long long at = g_requested_at_ns.load();
  return stop_requested() && at != 0 ? static_cast<double>(monotonic_ns() - at) * 1e-9 : 0.0;
}

}  // namespace ddp
