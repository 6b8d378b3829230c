// ddprun's signals: which it catches, which it passes on to the job, and the catching itself (a self-pipe the
// job's poll loop reads), so that a signal at any moment of a launch is acted on by the loop, outside a handler.
#pragma once

#include <signal.h>

namespace ddp {
namespace launcher {

// Passed on to the job instead of ending it (mpirun forwards it to every rank's wrapper, the wrapper to its
// program): each rank prints its flight recorder and goes on.
constexpr int kDumpSignal = SIGUSR2;
// A graceful stop, as mpirun hands it to every rank's wrapper (mpirun forwards SIGUSR1 and SIGUSR2 and nothing
// else), and the wrapper to its program.
constexpr int kGracefulStopSignal = SIGUSR1;

// The signals a cluster or a user stops a job with; the first asks the job to stop gracefully.
bool asks_graceful_stop(int sig);

// The signals CaughtSignals catches, as a set (to block them across a fork).
sigset_t caught_signal_set();

// ddprun's stop signals (and SIGUSR2), caught from construction to destruction, and SIGPIPE ignored: made first
// thing, before anything that takes time, so that a signal that comes before a job's ranks exist, between its
// attempts or while the hosts are asked, is kept for the job (which asks its ranks to stop once they can take
// it) instead of ending ddprun without a word or being lost. A signal ddprun was started with ignored stays
// ignored (`nohup ddprun ...`). One at a time in a process.
class CaughtSignals {
 public:
  CaughtSignals();
  ~CaughtSignals();
  CaughtSignals(const CaughtSignals&) = delete;
  CaughtSignals& operator=(const CaughtSignals&) = delete;
  // The read end of the pipe the handler writes each signal's number to (non-blocking).
  int read_fd() const { return pipe_[0]; }
  // The dispositions ddprun was started with, back (in a child before exec, and at the end).
  void restore() const;

 private:
  int pipe_[2] = {-1, -1};
};

// The dispositions ddprun was started with, back while a CaughtSignals lives (in a forked child before exec);
// nothing otherwise.
void restore_signal_dispositions();

}  // namespace launcher
}  // namespace ddp
