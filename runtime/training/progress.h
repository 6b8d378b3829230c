// Progress on rank 0: a bar redrawn in place on a terminal, plain lines otherwise (logs, CI, and under mpirun,
// which hands ranks a pseudo-terminal but relays their output line by line with a prefix).
#pragma once

#include <string>

namespace ddp::training {

class Progress {
 public:
  explicit Progress(long long total_steps);
  // A step's line: where the run stands, its mean loss, speed, the time since training began and the time left
  // at the recent speed; `hidden` is the share of the all-reduce time hidden under backward (< 0: not measured,
  // for a graph replay or a single rank, and not shown).
  void step(long long step, long long epoch, double loss, double samples_per_s, double hidden);
  // Any other line (an evaluation, a warning), below the bar on a terminal.
  void line(const std::string& text);

 private:
  long long total_;
  bool tty_;
  long long first_step_ = -1;  // the step count at the first line: a resumed run's ETA counts from there
  double started_ = 0;         // seconds (steady clock) at the first line
};

}  // namespace ddp::training
