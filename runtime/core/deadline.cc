#include "runtime/core/deadline.h"

#include <fstream>
#include <mutex>
#include <string>

namespace ddp {

double running_seconds() {
  using Clock = std::chrono::steady_clock;
  static std::mutex mutex;
  static Clock::time_point last = Clock::now();
  static double stopped_s = 0.0;
  std::lock_guard<std::mutex> lock(mutex);
  const Clock::time_point now = Clock::now();
  const double gap = std::chrono::duration<double>(now - last).count();
  if (gap > kLongestRunningGapS) stopped_s += gap;
  last = now;
  return std::chrono::duration<double>(now.time_since_epoch()).count() - stopped_s;
}

Deadline::Deadline(double seconds) : at_(running_seconds() + seconds) {}

bool Deadline::passed() const { return seconds_left() < 0; }

double Deadline::seconds_left() const { return at_ - running_seconds(); }

bool process_stopped(int pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(file, stat);
  // The state follows the command name, which is in parentheses and may hold spaces and parentheses itself.
  const std::size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;
  const char state = stat[name_end + 2];
  return state == 'T' || state == 't';
}

}  // namespace ddp
