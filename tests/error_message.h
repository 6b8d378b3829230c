// What a user reads when a call refuses its input: tests of bad input compare the message, not only the type.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <string>

namespace ddp::testing {

// The message of the `Error` that `f` throws, or "(no error)"; an exception of another type goes through.
template <typename Error>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Runs `f` in a child process that SIGALRM ends after `seconds`, and gives what became of it: the message of the
// `Error` it threw, "(no error)", or "(still running after N s)" for a call that blocks (a reader opening a FIFO):
// a test of a hang must end within its own bound, never wait on luck. The child exits with _exit, so nothing of
// the test's own state (its files, gtest's report) is touched there.
template <typename Error>
std::string error_message_within(unsigned seconds, const std::function<void()>& f) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return "(pipe failed)";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    ::alarm(seconds);
    const std::string message = error_message<Error>(f);
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char chunk[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) message.append(chunk, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
    return "(still running after " + std::to_string(seconds) + " s)";
  }
  return message;
}

}  // namespace ddp::testing
