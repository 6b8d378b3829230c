// Progress on rank 0: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI, and under mpirun,
// which hands ranks a pseudo-terminal but relays their output line by line with a prefix).
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
  long long first_step_;  // a resumed run's ETA counts from its own first step
  double started_;        // seconds (steady clock) when training started
};

}  // namespace ddp::training
