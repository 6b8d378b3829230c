#include "launcher/output.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace ddp {
namespace launcher {

Output::Output(JobStopper* stopper) : stopper_(stopper), terminal_(::isatty(STDOUT_FILENO) == 1) {}

void Output::write_line(int fd, const std::string& text, bool redraw) {
  if (redraw_showing_ && !redraw) {
    write(STDOUT_FILENO, "\033[K");
    redraw_showing_ = false;
  }
  write(fd, text);
  if (redraw && terminal_ && fd == STDOUT_FILENO) redraw_showing_ = true;
}

void Output::write(int fd, const std::string& text) {
  bool& closed = fd == STDOUT_FILENO ? stdout_closed_ : stderr_closed_;
  if (closed) return;
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      closed = true;
      if (errno == EPIPE) stopper_->stop(SIGPIPE);
      return;  // other errors (a full disk behind a redirect): keep the job, drop this stream's lines
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace launcher
}  // namespace ddp
