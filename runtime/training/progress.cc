// Progress lines and the terminal bar (see progress.h).
#include "runtime/training/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ddp::training {

Progress::Progress(long long total_steps)
    : total_(total_steps), tty_(isatty(STDOUT_FILENO) == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {}

void Progress::step(long long step, long long epoch, double loss, double samples_per_s, double hidden) {
  char line[256];
  int used = std::snprintf(line, sizeof line, "epoch %lld step %lld/%lld loss %.4f samples/s %.0f", epoch, step,
                           total_, loss, samples_per_s);
  if (hidden >= 0) std::snprintf(line + used, sizeof line - used, " comm_hidden %.0f%%", hidden * 100.0);
  if (tty_) {
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * static_cast<double>(step) / total_) : 0;
    std::printf("\r[%s%s] %s", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), line);
  } else {
    std::printf("%s\n", line);
  }
  std::fflush(stdout);
}

void Progress::line(const std::string& text) {
  std::printf("%s%s\n", tty_ ? "\n" : "", text.c_str());
  std::fflush(stdout);
}

}  // namespace ddp::training
