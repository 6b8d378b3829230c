// fork/exec with two pipes, one poll loop relaying both, and the job ended (its process group signalled)
// whatever ends ddprun: a signal, a closed output, or ddprun's own death.
#include "launcher/job.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "launcher/caught_signals.h"
#include "launcher/child_process.h"
#include "launcher/clock.h"
#include "launcher/failure_tracker.h"
#include "launcher/job_stopper.h"
#include "launcher/output.h"
#include "launcher/process_tree.h"
#include "launcher/rank_wrapper.h"
#include "launcher/relay.h"
#include "launcher/resources.h"
#include "launcher/start_watch.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {
namespace {

// How long mpirun may take to end by itself once every rank of a stopping job has ended.
constexpr long long kEndedJobSlackMs = 1000;

// One of mpirun's pipes: its bytes joined into whole lines, each of one rank and stream.
struct LineRelay {
  int fd;
  int default_out;  // where untagged lines from this pipe go
  TaggedLineJoiner lines;
  MpirunBannerFilter banners;  // mpirun's own lines on this pipe
  bool open = true;
  StartWatch* start_watch = nullptr;  // told the ranks' start markers, which are not relayed
};

void emit(const std::string& line, LineRelay& r, FailureTracker* tracker, Output* output) {
  tracker->observe(line, realtime_ns());
  if (parse_exit_marker(line)) return;
  if (const std::optional<StartMarker> start = parse_start_marker(parse_tagged_line(line).text)) {
    if (r.start_watch != nullptr) r.start_watch->observe(*start);
    return;
  }
  // mpirun's note on passing ddprun's SIGUSR1/SIGUSR2 on: ddprun has said what it does with them.
  if (line.rfind("mpirun: Forwarding signal ", 0) == 0) return;
  const TaggedLine t = parse_tagged_line(line);
  if (!t.tagged) {
    for (const std::string& kept : r.banners.feed(line)) output->write_line(r.default_out, kept + "\n", false);
    return;
  }
  const int out = t.stream == "stdout" ? STDOUT_FILENO : STDERR_FILENO;
  const bool redraw = TaggedLineJoiner::is_redraw(line);
  output->write_line(out, rewrite_tagged_line(line) + (redraw ? "" : "\n"), redraw);
}

// Reads what is there on `r` and emits its complete lines; closes it at end of file.
void drain(LineRelay& r, FailureTracker* tracker, Output* output) {
  char buffer[1 << 16];
  const ssize_t got = ::read(r.fd, buffer, sizeof buffer);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (got <= 0) {
    for (const std::string& line : r.lines.finish()) emit(line, r, tracker, output);
    for (const std::string& kept : r.banners.finish()) output->write_line(r.default_out, kept + "\n", false);
    r.open = false;
    ::close(r.fd);
    return;
  }
  for (const std::string& line : r.lines.feed(std::string(buffer, static_cast<size_t>(got)))) {
    emit(line, r, tracker, output);
  }
}

// Ctrl-Z (SIGTSTP): the job stops with ddprun and goes on with it, as a shell's job does. Left running under a
// stopped ddprun, the ranks would block on their output and the others would time out. Every process of the
// job on this node gets SIGSTOP (mpirun's group, and the wrappers and programs in groups of their own), then
// ddprun stops itself; once continued (`fg`, SIGCONT), it continues them. Their collective deadlines count
// running time only (runtime/core/deadline.h), so a stop of any length is no hang. Ranks on other nodes are out of
// reach of a stop: such a job is not stopped, and goes on.
void suspend_job(pid_t mpirun, bool other_hosts, Output* output) {
  if (other_hosts) {
    output->write(STDERR_FILENO, "ddprun: SIGTSTP: the job has ranks on other nodes, which cannot be stopped from "
                                 "here: it goes on (Ctrl-C stops it gracefully)\n");
    return;
  }
  std::vector<pid_t> job = descendants(mpirun, parent_links());
  job.push_back(mpirun);
  ::killpg(mpirun, SIGSTOP);
  for (pid_t pid : job) ::kill(pid, SIGSTOP);
  output->write(STDERR_FILENO, "ddprun: stopped with the job's " + std::to_string(job.size()) +
                                   " processes (fg or SIGCONT to go on)\n");
  ::raise(SIGSTOP);
  for (pid_t pid : job) ::kill(pid, SIGCONT);
  ::killpg(mpirun, SIGCONT);
  output->write(STDERR_FILENO, "ddprun: the job goes on\n");
}

void handle_signals(int signal_pipe_read, JobStopper* stopper, pid_t mpirun, bool other_hosts, Output* output) {
  unsigned char sigs[64];
  for (ssize_t n; (n = ::read(signal_pipe_read, sigs, sizeof sigs)) > 0;) {
    for (ssize_t i = 0; i < n; ++i) {
      if (sigs[i] == SIGTSTP) {
        suspend_job(mpirun, other_hosts, output);
      } else if (sigs[i] == kDumpSignal) {
        output->write(STDERR_FILENO, "ddprun: SIGUSR2: every rank prints its flight recorder; the job goes on\n");
        ::kill(mpirun, kDumpSignal);
      } else {
        if (stopper->why() == 0 && asks_graceful_stop(sigs[i])) {
          const char* name = ::sigabbrev_np(sigs[i]);
          output->write(STDERR_FILENO, std::string("ddprun: received SIG") + (name ? name : "?") +
                                           ": asking every rank to stop after its current step (a second signal "
                                           "ends the job now)\n");
        }
        stopper->on_signal(sigs[i]);
      }
    }
  }
}

// How many ranks of this node have left their exit marker in `dir` (the directory is left as it is).
int exit_markers_in(const std::string& dir) {
  if (dir.empty()) return 0;
  std::error_code ignored;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ignored)) {
    if (entry.path().filename().string().rfind("rank-", 0) == 0) ++count;
  }
  return count;
}

// The markers the wrappers left in `dir`, observed as if relayed; the directory is removed.
void read_exit_markers(const std::string& dir, FailureTracker* tracker) {
  if (dir.empty()) return;
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ignored)) {
    const std::string text = read_text(entry.path().string());
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      tracker->observe(text.substr(start, nl - start), realtime_ns());
    }
  }
  std::filesystem::remove_all(dir, ignored);
}

// The child's side of fork: its own process group (so a terminal's Ctrl-C reaches ddprun only, and ddprun can
// signal mpirun without signalling itself), SIGTERM when ddprun dies, then exec.
[[noreturn]] void exec_child(const std::vector<std::string>& argv, pid_t parent, int out_fd, int err_fd,
                             const sigset_t& unblock, const std::string& exit_dir) {
  ::setpgid(0, 0);
  if (!exit_dir.empty()) ::setenv(kExitDirVariable, exit_dir.c_str(), 1);
  // Even a SIGKILLed ddprun must not leave the job running: mpirun kills its ranks on SIGTERM.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(128 + SIGTERM);  // ddprun died before prctl took effect
  restore_signal_dispositions();
  ::sigprocmask(SIG_SETMASK, &unblock, nullptr);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  exec_or_exit(argv, "ddprun: ", " (is Open MPI installed? apt-get install openmpi-bin)");
}


// mpirun started as ddprun's child, its stdout and stderr on pipes.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};

Child start_child(const std::vector<std::string>& argv, const std::string& exit_dir) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
  }
  // Signals stay blocked across fork until the child has reset its handlers (else a signal in between would run
  // ddprun's handler in the child) and the parent knows the child's pid.
  const sigset_t stop_set = caught_signal_set();
  sigset_t previous;
  ::sigprocmask(SIG_BLOCK, &stop_set, &previous);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw Error(std::string("ddprun: fork failed: ") + std::strerror(errno));
  }
  if (child == 0) exec_child(argv, parent, out_pipe[1], err_pipe[1], previous, exit_dir);
  ::setpgid(child, child);  // also here, so that killpg works even before the child has run
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  return Child{child, out_pipe[0], err_pipe[0]};
}

// A job under way: what its poll loop watches, and one turn of that loop at a time.
class RunningJob {
 public:
  RunningJob(const Child& child, int stop_grace_ms, bool other_hosts, int ranks, int signal_fd,
             std::string exit_dir)
      : child_(child.pid),
        other_hosts_(other_hosts),
        ranks_(ranks),
        signal_fd_(signal_fd),
        exit_dir_(std::move(exit_dir)),
        stopper_(child.pid, stop_grace_ms, other_hosts),
        output_(&stopper_),
        start_watch_(ranks, start_timeout_s()),
        relays_{{child.out_fd, STDOUT_FILENO, {}, {}, true, &start_watch_},
                {child.err_fd, STDERR_FILENO, {}, {}, true, &start_watch_}} {}
  RunningJob(const RunningJob&) = delete;
  RunningJob& operator=(const RunningJob&) = delete;

  bool reaped() const { return reaped_; }
  void turn() {
    const bool piping = poll_and_relay();
    watch_start();
    end_job_whose_ranks_ended();
    stopper_.deliver_stop_request();
    stopper_.kill_if_overdue();
    if (!piping || (!relays_[0].open && !relays_[1].open)) reap();
  }
  // Once reaped: how the job ended.
  JobResult result();

 private:
  // Waits for a signal, a line or a deadline, and handles what came; whether a pipe was still open.
  bool poll_and_relay() {
    pollfd fds[3];
    LineRelay* which[3] = {nullptr, nullptr, nullptr};
    nfds_t n = 0;
    fds[n++] = {signal_fd_, POLLIN, 0};
    for (LineRelay& r : relays_) {
      if (!r.open) continue;
      fds[n] = {r.fd, POLLIN, 0};
      which[n++] = &r;
    }
    // With both pipes closed only the child's exit is awaited: poll the wait, 10 times a second.
    const bool piping = n > 1;
    // While the start is watched, often enough for its deadline to count running time (deadline.h).
    const int idle_ms = piping && !start_watch_.waiting() ? -1 : 100;
    if (::poll(fds, n, stopper_.poll_timeout_ms(idle_ms)) < 0 && errno != EINTR) {
      throw Error(std::string("ddprun: poll failed: ") + std::strerror(errno));
    }
    if (fds[0].revents & POLLIN) handle_signals(signal_fd_, &stopper_, child_, other_hosts_, &output_);
    for (nfds_t i = 1; i < n; ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*which[i], &tracker_, &output_);
    }
    return piping;
  }
  void watch_start() {
    if (const std::string late = start_watch_.overdue(); !late.empty()) {
      output_.write(STDERR_FILENO, "ddprun: error: " + late + "\n");
      start_failure_ = late;
      stopper_.end_job();
    }
  }
  // While stopping, every rank of a job on this node has left its exit marker: its end is reported now, not
  // when mpirun finishes its teardown (22 s after a Slurm requeue's SIGTERM, which mpirun gets too). A second
  // of slack lets an mpirun that is ending anyway relay the last lines itself.
  void end_job_whose_ranks_ended() {
    if (stopper_.why() == 0 || other_hosts_ || ranks_ <= 0 || exit_markers_in(exit_dir_) < ranks_) return;
    if (ranks_ended_ms_ < 0) ranks_ended_ms_ = monotonic_ms();
    if (monotonic_ms() - ranks_ended_ms_ > kEndedJobSlackMs) stopper_.kill_ended_job();
  }
  void reap() {
    pid_t got;
    while ((got = ::waitpid(child_, &status_, WNOHANG)) < 0 && errno == EINTR) {
    }
    reaped_ = got == child_;
  }

  pid_t child_;
  bool other_hosts_;
  int ranks_;
  int signal_fd_;
  std::string exit_dir_;
  JobStopper stopper_;
  Output output_;
  FailureTracker tracker_;
  StartWatch start_watch_;
  LineRelay relays_[2];
  std::string start_failure_;
  long long ranks_ended_ms_ = -1;  // when every rank's exit marker was first seen during a stop
  int status_ = 0;
  bool reaped_ = false;
};

JobResult RunningJob::result() {
  read_exit_markers(exit_dir_, &tracker_);
  JobResult result;
  result.exit_status =
      WIFEXITED(status_) ? WEXITSTATUS(status_) : WIFSIGNALED(status_) ? 128 + WTERMSIG(status_) : 1;
  result.first_failed_rank = start_failure_.empty() ? tracker_.first_failed_rank() : start_watch_.late_rank();
  result.start_failure = start_failure_;
  result.first_failure_how = tracker_.first_failure_how();
  result.lost_host = tracker_.lost_host();
  result.stopped_by = stopper_.why();
  result.stop_only_asked = stopper_.only_asked();
  result.ranks_stopped_as_asked = tracker_.ranks_stopped_as_asked();
  result.ranks_asked_to_stop = tracker_.ranks_asked_to_stop();
  result.stop_seconds = static_cast<double>(stopper_.ms_since_signal()) / 1000.0;
  return result;
}

}  // namespace

std::string ensure_open_files(int ranks_here) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";
  const long long needed = open_files_needed(ranks_here);
  const bool below = limit.rlim_cur != RLIM_INFINITY && static_cast<long long>(limit.rlim_cur) < needed;
  if (below && (limit.rlim_max == RLIM_INFINITY || limit.rlim_max > limit.rlim_cur)) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(needed)
                                                      : std::min<rlim_t>(limit.rlim_max, static_cast<rlim_t>(needed));
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return "";
  return open_files_refusal(ranks_here, static_cast<long long>(limit.rlim_cur));
}

JobResult run_job(const std::vector<std::string>& argv, int stop_grace_ms, CaughtSignals* signals, int ranks) {
  DDP_CHECK(!argv.empty(), "run_job: empty command");
  std::optional<CaughtSignals> own_signals;
  if (signals == nullptr) signals = &own_signals.emplace();
  const std::string exit_dir = private_directory("ddprun-exits");
  const Child child = start_child(argv, exit_dir);
  const bool other_hosts = std::find(argv.begin(), argv.end(), "--host") != argv.end() ||
                           std::find(argv.begin(), argv.end(), "--hostfile") != argv.end();
  RunningJob job(child, stop_grace_ms, other_hosts, ranks, signals->read_fd(), exit_dir);
  while (!job.reaped()) job.turn();
  return job.result();
}

}  // namespace launcher
}  // namespace ddp
