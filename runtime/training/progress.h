// Progress on rank 0: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI). Under mpirun the
// ranks' output goes through pipes, so a rank cannot see the terminal: DDP_PROGRESS_BAR=1 (which ddprun sets when
// its own stdout is a terminal) asks for the bar, =0 for plain lines. Each bar ends in "\r", with the cursor at
// the line's start, so that a relay can pass it on at once.
#pragma once

#include <string>

namespace ddp::training {

class Progress {
 public:
  // Training starts now, at `first_step` (a resumed run's step) of `total_steps`.
  Progress(long long total_steps, long long first_step);
  // A step's line: where the run stands, its mean loss, speed, the time since training began and the time left
  // at the recent speed; `hidden` is the share of the all-reduce time hidden under backward (< 0: not measured,
  // for a graph replay or a single rank, and not shown).
  void step(long long step, long long epoch, double loss, double samples_per_s, double hidden);
  // Any other line (an evaluation, a warning), below the bar on a terminal.
  void line(const std::string& text);

 private:
  long long total_;
  bool tty_;
  bool bar_shown_ = false;  // a bar is on the terminal's last line
  long long first_step_;  // a resumed run's ETA counts from its own first step
  double started_;        // seconds (steady clock) when training started
};

}  // namespace ddp::training
