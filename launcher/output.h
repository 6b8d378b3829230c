// ddprun's own stdout and stderr, where the job's lines go. A write that fails with EPIPE (the reader is gone,
// as in `ddprun ... | head -1`) closes that stream for good and stops the job, as SIGPIPE would end any
// program in a pipeline, except that here the job ends too instead of running on unseen.
#pragma once

#include <string>

#include "launcher/job_stopper.h"

namespace ddp {
namespace launcher {

// A rank's redraw (a progress bar drawn in place, ending in '\r') stays on the terminal's last line until
// something else is written, which first clears that line ("\033[K"), so that a shorter line does not keep the
// bar's tail.
class Output {
 public:
  explicit Output(JobStopper* stopper);
  // A whole line (with its newline), or a redraw (ending in '\r', to stdout).
  void write_line(int fd, const std::string& text, bool redraw);
  // `text` to `fd` (STDOUT_FILENO or STDERR_FILENO) unless that stream is closed.
  void write(int fd, const std::string& text);

 private:
  JobStopper* stopper_;
  bool terminal_;
  bool redraw_showing_ = false;
  bool stdout_closed_ = false;
  bool stderr_closed_ = false;
};

}  // namespace launcher
}  // namespace ddp
