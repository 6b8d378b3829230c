#include "launcher/caught_signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

// The signals ddprun catches: every one whose default action would end it and that can be caught (each ends the
// job first, except kDumpSignal), and SIGTSTP (Ctrl-Z: the job stops with ddprun, suspend_job).
constexpr int kCaughtSignals[] = {SIGHUP,  SIGINT,  SIGQUIT,   SIGTERM, SIGUSR1, SIGUSR2,
                                  SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF, SIGXFSZ, SIGTSTP};

// The signal handler only hands the signal to the poll loop (a self-pipe), so the loop wakes for it and does
// the killing and the bookkeeping outside the handler, with no race between a check and poll().
int g_signal_pipe = -1;
void hand_to_loop(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (::write(g_signal_pipe, &byte, 1) < 0) {
  }  // the pipe is full: a signal is already waiting, which is enough
  errno = saved;
}

// The dispositions ddprun was started with, while a CaughtSignals lives (restored in children before exec).
struct sigaction g_old_actions[std::size(kCaughtSignals)] {};
struct sigaction g_old_pipe_action {};
bool g_signals_caught = false;

}  // namespace

bool asks_graceful_stop(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGUSR1; }

sigset_t caught_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kCaughtSignals) sigaddset(&set, sig);
  return set;
}

void restore_signal_dispositions() {
  if (!g_signals_caught) return;
  for (size_t i = 0; i < std::size(kCaughtSignals); ++i) ::sigaction(kCaughtSignals[i], &g_old_actions[i], nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe_action, nullptr);
}

CaughtSignals::CaughtSignals() {
  DDP_CHECK(!g_signals_caught, "CaughtSignals: one at a time");
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
  }
  g_signal_pipe = pipe_[1];
  struct sigaction action {};
  action.sa_handler = hand_to_loop;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kCaughtSignals); ++i) {
    ::sigaction(kCaughtSignals[i], nullptr, &g_old_actions[i]);
    if (g_old_actions[i].sa_handler != SIG_IGN) ::sigaction(kCaughtSignals[i], &action, nullptr);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &g_old_pipe_action);
  g_signals_caught = true;
}

CaughtSignals::~CaughtSignals() {
  restore();
  g_signals_caught = false;
  g_signal_pipe = -1;
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

void CaughtSignals::restore() const { restore_signal_dispositions(); }

}  // namespace launcher
}  // namespace ddp
