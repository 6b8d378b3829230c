// Progress lines and the terminal bar (see progress.h).
#include "runtime/training/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/settings.h"

namespace ddp::training {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// 75 s as "75s", 3723 s as "1h02m".
std::string duration(double s) {
  char text[32];
  const long long t = static_cast<long long>(s + 0.5);
  if (t < 100) {
    std::snprintf(text, sizeof text, "%.1fs", s);
  } else if (t < 3600) {
    std::snprintf(text, sizeof text, "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(text, sizeof text, "%lldh%02lldm", t / 3600, t / 60 % 60);
  }
  return text;
}

// DDP_PROGRESS_BAR=1 or 0 when set (ddprun sets 1 when its own stdout is a terminal), else whether stdout is a
// terminal of our own (not under mpirun).
bool wants_bar() {
  const settings::Setting& bar = settings::setting("DDP_PROGRESS_BAR");
  if (settings::is_set(bar)) return settings::text(bar) == "1";
  return isatty(STDOUT_FILENO) == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr;
}

}  // namespace

Progress::Progress(long long total_steps, long long first_step)
    : total_(total_steps),
      tty_(wants_bar()),
      first_step_(first_step),
      started_(now_s()) {}

void Progress::step(long long step, long long epoch, double loss, double samples_per_s, double hidden) {
  const double now = now_s();
  // The ETA: the steps left at the pace of the steps taken so far.
  const double pace = step > first_step_ ? (now - started_) / static_cast<double>(step - first_step_) : 0;
  const std::string eta = step > first_step_ ? duration(pace * static_cast<double>(total_ - step)) : "?";
  char line[256];
  int used = std::snprintf(line, sizeof line, "epoch=%lld step=%lld/%lld loss=%.4f samples/s=%.0f elapsed=%s eta=%s",
                           epoch, step, total_, loss, samples_per_s, duration(now - started_).c_str(), eta.c_str());
  if (hidden >= 0) std::snprintf(line + used, sizeof line - used, " comm_hidden=%.0f%%", hidden * 100.0);
  if (tty_) {
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * static_cast<double>(step) / total_) : 0;
    // The bar, the rest of the line cleared, the cursor back at its start: the next bar or line overwrites it
    // (and a relay such as ddprun's passes each bar on whole at its '\r').
    std::printf("[%s%s] %s\033[K\r", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                line);
    bar_shown_ = true;
  } else {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
}

void Progress::line(const std::string& text) {
  // On a terminal the line takes the bar's place (cleared first); the next step draws the bar below it.
  std::printf("%s%s\n", bar_shown_ ? "\033[K" : "", text.c_str());
  bar_shown_ = false;
  std::fflush(stdout);
}

}  // namespace ddp::training
