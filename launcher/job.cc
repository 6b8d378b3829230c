// fork/exec with two pipes, one poll loop relaying both, and the job ended (its process group signalled)
// whatever ends ddprun: a signal, a closed output, or ddprun's own death.
#include "launcher/job.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/command.h"
#include "launcher/start_watch.h"
#include "runtime/core/check.h"
#include "runtime/core/stop_request.h"

namespace ddp {
namespace launcher {
namespace {

// The signals ddprun catches: every one whose default action would end it and that can be caught (each ends the
// job first, except kDumpSignal), and SIGTSTP (Ctrl-Z: the job stops with ddprun, suspend_job).
constexpr int kCaughtSignals[] = {SIGHUP,  SIGINT,  SIGQUIT,   SIGTERM, SIGUSR1, SIGUSR2,
                                  SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF, SIGXFSZ, SIGTSTP};
// Passed on to the job instead (mpirun forwards it to every rank's wrapper, the wrapper to its program): each
// rank prints its flight recorder and goes on.
constexpr int kDumpSignal = SIGUSR2;
// A graceful stop, as mpirun hands it to every rank's wrapper (mpirun forwards SIGUSR1 and SIGUSR2 and nothing
// else), and the wrapper to its program.
constexpr int kGracefulStopSignal = SIGUSR1;

// The signals a cluster or a user stops a job with; the first asks the job to stop gracefully.
bool asks_graceful_stop(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGUSR1; }

long long realtime_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

long long monotonic_ms() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000LL + now.tv_nsec / 1000000;
}

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

void restore_signal_dispositions() {
  if (!g_signals_caught) return;
  for (size_t i = 0; i < std::size(kCaughtSignals); ++i) ::sigaction(kCaughtSignals[i], &g_old_actions[i], nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe_action, nullptr);
}

// A file's whole text ("" when it cannot be read): /proc's files, whose size stat does not give.
std::string read_text(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
    std::fclose(f);
  }
  return text;
}

// The processes /proc lists now.
std::vector<pid_t> process_ids() {
  std::vector<pid_t> pids;
  if (DIR* proc = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (end != entry->d_name && *end == '\0') pids.push_back(static_cast<pid_t>(pid));
    }
    ::closedir(proc);
  }
  return pids;
}

// The program process `pid` runs (/proc/PID/exe), or "" when it cannot be read.
std::string executable_of(pid_t pid) {
  char path[4096];
  const ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), path, sizeof path);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : "";
}

// Each process's parent, from /proc.
std::map<pid_t, pid_t> parent_links() {
  std::map<pid_t, pid_t> parent_of;
  for (pid_t pid : process_ids()) {
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
    long ppid = 0;
    if (close != std::string::npos && std::sscanf(stat.c_str() + close + 1, " %*c %ld", &ppid) == 1) {
      parent_of[pid] = static_cast<pid_t>(ppid);
    }
  }
  return parent_of;
}

// The processes below `root` on this node (its children, theirs, ...).
std::vector<pid_t> descendants(pid_t root, const std::map<pid_t, pid_t>& parent_of) {
  std::vector<pid_t> below;
  for (const auto& [pid, ppid] : parent_of) {
    bool below_root = false;
    for (pid_t up = ppid, hops = 0; up > 1 && hops < 64 && !below_root; ++hops) {
      below_root = up == root;
      const auto it = parent_of.find(up);
      up = it == parent_of.end() ? 0 : it->second;
    }
    if (below_root) below.push_back(pid);
  }
  return below;
}

// The rank wrappers on this node among the descendants of `root` (mpirun): /proc's parent links, then each
// one's command line and program.
std::vector<pid_t> local_rank_wrappers(pid_t root) {
  const std::string self = executable_of(::getpid());
  std::map<pid_t, pid_t> parent_of = parent_links();
  std::vector<pid_t> wrappers;
  for (pid_t pid : descendants(root, parent_of)) {
    const std::string cmdline = read_text("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.find(std::string(kRankWrapperFlag) + '\0') == std::string::npos) continue;
    // mpirun's own child between its fork and the exec of the wrapper has mpirun's command line, which holds the
    // wrapper's flag too, and mpirun's handlers: a stop sent to it then would kill the rank as it starts. A
    // wrapper runs this very program.
    if (executable_of(pid) != self) continue;
    wrappers.push_back(pid);
  }
  // A wrapper's child between its fork and the exec of the program still has the wrapper's command line: it is
  // not a wrapper (a stop sent to it then would kill it).
  std::vector<pid_t> outermost;
  for (pid_t pid : wrappers) {
    if (std::find(wrappers.begin(), wrappers.end(), parent_of[pid]) == wrappers.end()) outermost.push_back(pid);
  }
  return outermost;
}

// Whether process `pid` catches `sig` (its handler is installed): the SigCgt mask of /proc/PID/status.
bool catches_signal(pid_t pid, int sig) {
  const std::string status = read_text("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("\nSigCgt:");
  if (at == std::string::npos) return false;
  const unsigned long long mask = std::strtoull(status.c_str() + at + 8, nullptr, 16);
  return (mask >> (sig - 1)) & 1ULL;
}

// How often a graceful stop is handed again to mpirun (for ranks on other nodes that did not exist yet; a
// wrapper asked twice passes it on once), and looked for new local wrappers.
constexpr int kStopRedeliveryMs = 100;
// How long mpirun may take to end by itself once every rank of a stopping job has ended.
constexpr long long kEndedJobSlackMs = 1000;
constexpr int kStopRedeliveryToMpirunMs = 1000;

// Ends the job once asked. SIGTERM, SIGINT or SIGUSR1 first ask for a graceful stop: SIGUSR1 to this node's
// rank wrappers and to mpirun, which passes it to the ranks of the other nodes (not every build of Open MPI
// forwards SIGUSR1; a wrapper asked twice passes it on once) (the programs that handle it finish their step,
// write a checkpoint and exit with ddp::kStoppedExitStatus). The request is held until the job can take it: a
// process gets SIGUSR1 only once it catches it (before, it would die of it), and wrappers that start later
// (a signal in ddprun's first moments, or right after a restart) get it when they appear; mpirun, for the
// ranks of other nodes, gets it again every second. If the job is still there `graceful_ms` after the
// signal (ddprun --stop-grace), or at the next signal, it is ended: SIGTERM to mpirun's process group (mpirun then kills its ranks,
// in about 2 s), and SIGKILL kStopGraceMs later or at a further signal. Any other signal, or a closed output,
// ends it at once the same way. A SIGKILLed mpirun does not leave its ranks behind: their wrappers die with it
// (PR_SET_PDEATHSIG), and the programs with them.
class JobStopper {
 public:
  // `other_hosts`: the job has ranks on other nodes, which only mpirun can reach.
  JobStopper(pid_t group, int graceful_ms, bool other_hosts)
      : group_(group), graceful_ms_(graceful_ms), other_hosts_(other_hosts) {}
  // A signal to ddprun: the first stops the job (gracefully when it can be asked to), each further one hurries.
  void on_signal(int sig) {
    if (why_ == 0) signalled_ms_ = monotonic_ms();
    if (why_ == 0 && asks_graceful_stop(sig)) {
      why_ = sig;
      graceful_ = true;
      deadline_ms_ = monotonic_ms() + graceful_ms_;
      deliver_stop_request();
    } else if (why_ != 0 && !terminating_) {
      terminate();
    } else if (why_ != 0) {
      kill_now();
    } else {
      stop(sig);
    }
  }
  // Hands a graceful stop to the processes that can take it now and have not had it yet (called on every turn
  // of the loop; does something at most every kStopRedeliveryMs).
  void deliver_stop_request() {
    if (!graceful_ || terminating_) return;
    const long long now = monotonic_ms();
    if (now < next_delivery_ms_) return;
    next_delivery_ms_ = now + kStopRedeliveryMs;
    for (pid_t wrapper : local_rank_wrappers(group_)) {
      if (told_.count(wrapper) || !catches_signal(wrapper, kGracefulStopSignal)) continue;
      ::kill(wrapper, kGracefulStopSignal);
      told_.insert(wrapper);
    }
    // mpirun alone, not its group: the programs must not get it directly. Only for ranks on other nodes: here
    // the wrappers have it from us, each once it catches it (mpirun's copy could reach a wrapper too young to).
    if (other_hosts_ && now >= next_mpirun_delivery_ms_ && catches_signal(group_, kGracefulStopSignal)) {
      ::kill(group_, kGracefulStopSignal);
      next_mpirun_delivery_ms_ = now + kStopRedeliveryToMpirunMs;
    }
  }
  // Every rank has ended while the job was stopping: mpirun's own teardown is all that is left, and nothing of it
  // is worth waiting for (a Slurm job's signal to mpirun stretches it to about the stop grace). The stop itself is
  // not escalated: the ranks' own statuses say how it went.
  void kill_ended_job() {
    if (killed_) return;
    killed_ = true;
    ::killpg(group_, SIGKILL);
  }
  // Ending the job at once for a reason of ddprun's own (not a signal: no stop is reported, the job failed).
  void end_job() {
    if (!terminating_) terminate();
  }
  // Ending the job for `why` at once (idempotent: a second closed stream is no reason to hurry).
  void stop(int why) {
    if (terminating_) return;
    if (why_ == 0) {
      why_ = why;
      signalled_ms_ = monotonic_ms();
    }
    terminate();
  }
  void kill_if_overdue() {
    if ((why_ == 0 && !terminating_) || monotonic_ms() < deadline_ms_) return;
    if (!terminating_) {
      terminate();  // the graceful stop took too long
    } else {
      kill_now();
    }
  }
  // How long poll() may sleep: until the deadline while stopping, else `idle_ms`.
  int poll_timeout_ms(int idle_ms) const {
    if ((why_ == 0 && !terminating_) || killed_) return idle_ms;
    long long left = std::max(0LL, deadline_ms_ - monotonic_ms());
    if (graceful_ && !terminating_) left = std::min<long long>(left, kStopRedeliveryMs);
    return idle_ms < 0 ? static_cast<int>(left) : static_cast<int>(std::min<long long>(left, idle_ms));
  }
  int why() const { return why_; }
  // True while the job was only asked to stop (not terminated): its own exit status then says how it ended.
  bool only_asked() const { return graceful_ && !terminating_; }
  // Milliseconds from the first signal to now.
  long long ms_since_signal() const { return why_ == 0 ? 0 : monotonic_ms() - signalled_ms_; }

 private:
  void terminate() {
    terminating_ = true;
    ::killpg(group_, SIGTERM);
    deadline_ms_ = monotonic_ms() + kStopGraceMs;
  }
  void kill_now() {
    if (killed_) return;
    killed_ = true;
    ::killpg(group_, SIGKILL);
  }
  pid_t group_;
  int graceful_ms_;
  bool other_hosts_;
  int why_ = 0;
  bool graceful_ = false;
  bool terminating_ = false;
  bool killed_ = false;
  long long deadline_ms_ = 0;
  long long signalled_ms_ = 0;
  long long next_delivery_ms_ = 0;
  long long next_mpirun_delivery_ms_ = 0;
  std::set<pid_t> told_;  // local wrappers handed the graceful stop
};

// ddprun's own stdout and stderr. A write that fails with EPIPE (the reader is gone, as in
// `ddprun ... | head -1`) closes that stream for good and stops the job, as SIGPIPE would end any program in
// a pipeline, except that here the job ends too instead of running on unseen.
// A rank's redraw (a progress bar drawn in place, ending in '\r') stays on the terminal's last line until
// something else is written, which first clears that line ("\033[K"), so that a shorter line does not keep the
// bar's tail.
class Output {
 public:
  explicit Output(JobStopper* stopper) : stopper_(stopper), terminal_(::isatty(STDOUT_FILENO) == 1) {}
  // A whole line (with its newline), or a redraw (ending in '\r', to stdout).
  void write_line(int fd, const std::string& text, bool redraw) {
    if (redraw_showing_ && !redraw) {
      write(STDOUT_FILENO, "\033[K");
      redraw_showing_ = false;
    }
    write(fd, text);
    if (redraw && terminal_ && fd == STDOUT_FILENO) redraw_showing_ = true;
  }
  void write(int fd, const std::string& text) {
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

 private:
  JobStopper* stopper_;
  bool terminal_;
  bool redraw_showing_ = false;
  bool stdout_closed_ = false;
  bool stderr_closed_ = false;
};

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// The end of every forked child here: exec `argv`, or say why not ("<prefix>cannot run PROGRAM: why", and
// `not_found_hint` when there is no such program) and exit 127, as a shell does.
[[noreturn]] void exec_or_exit(const std::vector<std::string>& argv, const char* prefix,
                               const char* not_found_hint = "") {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  const int error = errno;
  write_all(STDERR_FILENO, std::string(prefix) + "cannot run " + args[0] + ": " + std::strerror(error) +
                               (error == ENOENT ? not_found_hint : "") + "\n");
  ::_exit(127);
}

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

// A new directory of this user's under TMPDIR (or /tmp) named `prefix`.XXXXXX, or "" when none can be made
// (the caller then does without).
std::string private_directory(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + ".XXXXXX";
  return ::mkdtemp(path.data()) != nullptr ? path : "";
}

// Where the rank wrappers of this node also leave their exit markers (a file per rank), named to them by this
// variable in mpirun's environment, which its local ranks inherit: mpirun stops relaying the ranks' output
// once it is signalled itself (Slurm signals every process of a job at once), and the markers of ranks that
// then stop as asked would be lost with it.
constexpr const char* kExitDirVariable = "DDPRUN_EXIT_DIR";

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

JobResult run_job(const std::vector<std::string>& argv, int stop_grace_ms, CaughtSignals* signals, int ranks) {
  DDP_CHECK(!argv.empty(), "run_job: empty command");
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
  }
  std::optional<CaughtSignals> own_signals;
  if (signals == nullptr) signals = &own_signals.emplace();
  const int signal_pipe_read = signals->read_fd();
  const std::string exit_dir = private_directory("ddprun-exits");

  // Signals stay blocked across fork until the child has reset its handlers (else a signal in between would run
  // ddprun's handler in the child) and the parent knows the child's pid.
  sigset_t stop_set, previous;
  sigemptyset(&stop_set);
  for (int sig : kCaughtSignals) sigaddset(&stop_set, sig);
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

  const bool other_hosts = std::find(argv.begin(), argv.end(), "--host") != argv.end() ||
                           std::find(argv.begin(), argv.end(), "--hostfile") != argv.end();
  JobStopper stopper(child, stop_grace_ms, other_hosts);
  Output output(&stopper);
  FailureTracker tracker;
  StartWatch start_watch(ranks, start_timeout_s());
  LineRelay relays[2] = {{out_pipe[0], STDOUT_FILENO, {}, {}, true, &start_watch},
                         {err_pipe[0], STDERR_FILENO, {}, {}, true, &start_watch}};
  std::string start_failure;
  long long ranks_ended_ms = -1;  // when every rank's exit marker was first seen during a stop
  int status = 0;
  bool reaped = false;
  while (!reaped) {
    pollfd fds[3];
    LineRelay* which[3] = {nullptr, nullptr, nullptr};
    nfds_t n = 0;
    fds[n++] = {signal_pipe_read, POLLIN, 0};
    for (LineRelay& r : relays) {
      if (!r.open) continue;
      fds[n] = {r.fd, POLLIN, 0};
      which[n++] = &r;
    }
    // With both pipes closed only the child's exit is awaited: poll the wait, 10 times a second.
    const bool piping = n > 1;
    // While the start is watched, often enough for its deadline to count running time (deadline.h).
    const int idle_ms = piping && !start_watch.waiting() ? -1 : 100;
    if (::poll(fds, n, stopper.poll_timeout_ms(idle_ms)) < 0 && errno != EINTR) {
      throw Error(std::string("ddprun: poll failed: ") + std::strerror(errno));
    }
    if (fds[0].revents & POLLIN) handle_signals(signal_pipe_read, &stopper, child, other_hosts, &output);
    for (nfds_t i = 1; i < n; ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*which[i], &tracker, &output);
    }
    if (const std::string late = start_watch.overdue(); !late.empty()) {
      output.write(STDERR_FILENO, "ddprun: error: " + late + "\n");
      start_failure = late;
      stopper.end_job();
    }
    // While stopping, every rank of a job on this node has left its exit marker: its end is reported now, not
    // when mpirun finishes its teardown (22 s after a Slurm requeue's SIGTERM, which mpirun gets too). A second
    // of slack lets an mpirun that is ending anyway relay the last lines itself.
    if (stopper.why() != 0 && !other_hosts && ranks > 0 && exit_markers_in(exit_dir) >= ranks) {
      if (ranks_ended_ms < 0) ranks_ended_ms = monotonic_ms();
      if (monotonic_ms() - ranks_ended_ms > kEndedJobSlackMs) stopper.kill_ended_job();
    }
    stopper.deliver_stop_request();
    stopper.kill_if_overdue();
    if (!piping || (!relays[0].open && !relays[1].open)) {
      pid_t got;
      while ((got = ::waitpid(child, &status, WNOHANG)) < 0 && errno == EINTR) {
      }
      reaped = got == child;
    }
  }
  read_exit_markers(exit_dir, &tracker);

  JobResult result;
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  result.first_failed_rank = start_failure.empty() ? tracker.first_failed_rank() : start_watch.late_rank();
  result.start_failure = start_failure;
  result.first_failure_how = tracker.first_failure_how();
  result.lost_host = tracker.lost_host();
  result.stopped_by = stopper.why();
  result.stop_only_asked = stopper.only_asked();
  result.ranks_stopped_as_asked = tracker.ranks_stopped_as_asked();
  result.ranks_asked_to_stop = tracker.ranks_asked_to_stop();
  result.stop_seconds = static_cast<double>(stopper.ms_since_signal()) / 1000.0;
  return result;
}

namespace {

// What a probe's output says about its host: its facts, or the first line that says what went wrong.
HostAnswer read_probe_output(const std::string& output, int status, bool timed_out, int timeout_ms) {
  HostAnswer answer;
  std::string first;
  size_t start = 0;
  for (size_t nl; start < output.size(); start = nl + 1) {
    nl = output.find('\n', start);
    if (nl == std::string::npos) nl = output.size();
    std::string line = output.substr(start, nl - start);
    // ssh ends its messages with "\r\n".
    line.erase(std::remove(line.begin(), line.end(), '\r'), line.end());
    if (const std::optional<HostFacts> facts = parse_probe_line(line)) {
      answer.facts = *facts;
      answer.reachable = true;
    } else if (first.empty() && line.find_first_not_of(" -") != std::string::npos) {
      first = parse_tagged_line(line).text;
    }
  }
  if (answer.reachable && status == 0) return answer;
  answer.reachable = false;
  if (timed_out) {
    answer.error = "no answer within " + std::to_string(timeout_ms / 1000) + " s" + (first.empty() ? "" : ": " + first);
  } else {
    answer.error = first.empty() ? "mpirun's status " + std::to_string(status) : first;
  }
  return answer;
}

}  // namespace

std::vector<HostAnswer> probe_hosts(const std::vector<HostSlots>& hosts, const MachineFacts& facts,
                                    const std::string& self, int timeout_ms) {
  struct Probe {
    pid_t pid = -1;
    int fd = -1;
    std::string output;
    int status = 0;
    bool done = false;
    std::string session_base;  // this probe's mpirun's own session directories; removed after it
  };
  std::vector<Probe> probes(hosts.size());
  const pid_t parent = ::getpid();
  for (size_t i = 0; i < hosts.size(); ++i) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(std::string("ddprun: pipe failed: ") + std::strerror(errno));
    probes[i].session_base = private_directory("ddprun-probe");
    const std::vector<std::string> argv = build_probe_command(hosts[i].host, facts, self, probes[i].session_base);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("ddprun: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(128 + SIGTERM);
      restore_signal_dispositions();
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      ::dup2(pipe_fds[1], STDOUT_FILENO);
      ::dup2(pipe_fds[1], STDERR_FILENO);
      exec_or_exit(argv, "");
    }
    ::setpgid(pid, pid);
    ::close(pipe_fds[1]);
    probes[i].pid = pid;
    probes[i].fd = pipe_fds[0];
  }
  const long long deadline = monotonic_ms() + timeout_ms;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Probe*> which;
    for (Probe& p : probes) {
      if (p.fd < 0) continue;
      fds.push_back({p.fd, POLLIN, 0});
      which.push_back(&p);
    }
    const long long left = deadline - monotonic_ms();
    if (fds.empty() || left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t got = ::read(which[k]->fd, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(which[k]->fd);
        which[k]->fd = -1;
      } else if (which[k]->output.size() < (1 << 16)) {
        which[k]->output.append(buffer, static_cast<size_t>(got));
      }
    }
  }
  std::vector<HostAnswer> answers;
  for (Probe& p : probes) {
    const bool timed_out = p.fd >= 0;
    if (timed_out) {
      ::killpg(p.pid, SIGKILL);
      ::close(p.fd);
    }
    int status = 0;
    while (::waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!p.session_base.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(p.session_base, ignored);
    }
    answers.push_back(read_probe_output(p.output, code, timed_out, timeout_ms));
  }
  return answers;
}

namespace {

volatile sig_atomic_t g_program = 0;  // the wrapper's child
volatile sig_atomic_t g_told_to_stop = 0;
volatile sig_atomic_t g_asked_to_stop = 0;  // a graceful stop (SIGUSR1), handed on from the wait loop

void forward_to_program(int sig) {
  g_told_to_stop = 1;
  if (g_program > 0) ::kill(static_cast<pid_t>(g_program), sig);
}

void forward_dump_to_program(int sig) {
  if (g_program > 0) ::kill(static_cast<pid_t>(g_program), sig);
}

void note_stop_request(int) { g_asked_to_stop = 1; }


// A graceful stop asked of this rank: SIGUSR1 to a program that handles it (the runtime's stop handlers finish
// the step and write a checkpoint), SIGTERM to one that does not (SIGUSR1 would kill it as a failure).
void hand_on_stop_request(pid_t program) {
  if (catches_signal(program, SIGUSR1)) {
    ::kill(program, SIGUSR1);
  } else {
    g_told_to_stop = 1;
    ::kill(program, SIGTERM);
  }
}

// The wrapper's handlers: SIGINT and SIGTERM go on to the program, SIGUSR2 (a dump) too without interrupting
// the wait, and a graceful stop is noted for the wait loop to hand on.
void route_signals_to_program() {
  struct sigaction action {};
  action.sa_handler = forward_to_program;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  struct sigaction dump {};
  dump.sa_handler = forward_dump_to_program;
  sigemptyset(&dump.sa_mask);
  dump.sa_flags = SA_RESTART;
  ::sigaction(kDumpSignal, &dump, nullptr);
  struct sigaction graceful {};
  graceful.sa_handler = note_stop_request;  // no SA_RESTART: the wait returns to hand it on
  sigemptyset(&graceful.sa_mask);
  ::sigaction(kGracefulStopSignal, &graceful, nullptr);
}

// The child's side of the wrapper's fork: the program, with the signals' default actions back.
[[noreturn]] void exec_program(const std::vector<std::string>& program, pid_t parent) {
  // If mpirun SIGKILLs the wrapper, the program must not live on as an orphan holding its GPU.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  // A process group of its own: mpirun signals the wrapper's group, and every signal must reach the program
  // once, through the wrapper (a graceful stop that came twice would be taken for the user insisting).
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGTERM, kDumpSignal, kGracefulStopSignal}) ::signal(sig, SIG_DFL);
  exec_or_exit(program, "ddprun: ");
}

// Whether `child` has exec'ed its program: until then it is a copy of the wrapper, which catches SIGUSR1 with
// the wrapper's handler (a stop handed to it then would be lost in the exec).
bool runs_its_program(pid_t child) {
  char self[4096], exe[4096];
  const ssize_t a = ::readlink("/proc/self/exe", self, sizeof self);
  const ssize_t b = ::readlink(("/proc/" + std::to_string(child) + "/exe").c_str(), exe, sizeof exe);
  return a > 0 && b > 0 && std::string(self, static_cast<size_t>(a)) != std::string(exe, static_cast<size_t>(b));
}

// How long after its start a program may take to catch SIGUSR1 (its stop handlers are installed first thing
// in main, but loading it can take seconds on a loaded node): a graceful stop asked before is held until it
// does, or until then, and is then handed on as SIGTERM, as to a program that does not handle it.
constexpr int kStopHoldMs = 10000;

// Waits for the program, handing on (once) a graceful stop asked before or meanwhile, as soon as the program
// can take it; its exit code, or 128 + the signal that ended it (`*signal` set to that signal).
int wait_for_program(pid_t child, long long started_ms, int* signal) {
  g_program = child;
  if (g_told_to_stop) ::kill(child, SIGTERM);  // told before the program existed
  int status = 0;
  bool handed_on = false;
  for (;;) {
    if (g_asked_to_stop && !handed_on) {
      if ((runs_its_program(child) && catches_signal(child, SIGUSR1)) ||
          monotonic_ms() - started_ms >= kStopHoldMs) {
        handed_on = true;
        hand_on_stop_request(child);
      }
    }
    if (g_asked_to_stop && !handed_on) {
      // Held until the program catches SIGUSR1: look again shortly.
      const pid_t got = ::waitpid(child, &status, WNOHANG);
      if (got == child || (got < 0 && errno != EINTR)) break;
      ::usleep(5000);
      continue;
    }
    if (::waitpid(child, &status, 0) >= 0 || errno != EINTR) break;
  }
  g_program = 0;
  *signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

}  // namespace

int run_rank_wrapper(const std::vector<std::string>& program) {
  // If mpirun (or orted) dies without ending us (SIGKILLed, or crashed), end with it rather than run on as an
  // orphan; the program follows by its own parent-death signal. A parent that died before prctl took effect
  // shows as a changed parent pid.
  const pid_t launcher = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) return 128 + SIGKILL;
  if (program.empty()) {
    write_all(STDERR_FILENO, "ddprun: rank wrapper: no program given\n");
    return 2;
  }
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank_env == nullptr) rank_env = std::getenv("PMIX_RANK");
  const int rank = rank_env ? std::atoi(rank_env) : -1;

  route_signals_to_program();
  ::setenv(kStartMarkersVariable, "1", 1);  // the program's runtime tells ddprun of its start (start_watch.h)
  const pid_t parent = ::getpid();
  const long long started_ms = monotonic_ms();
  const pid_t child = ::fork();
  if (child < 0) {
    write_all(STDERR_FILENO, std::string("ddprun: rank wrapper: fork failed: ") + std::strerror(errno) + "\n");
    return 1;
  }
  if (child == 0) exec_program(program, parent);
  int signal = 0;
  const int code = wait_for_program(child, started_ms, &signal);
  if (code != 0) {
    ExitMarker marker;
    marker.rank = rank;
    marker.status = code;
    marker.time_ns = realtime_ns();
    // A program that stopped as asked (ddp::kStoppedExitStatus) has not failed either.
    marker.stopped = g_told_to_stop != 0 || code == kStoppedExitStatus;
    // Asked to stop by a signal sent to the program itself, not through us (one that ended it, or a second
    // one that ended it at once), or a stop that failed (its checkpoint could not be written): a stop, which
    // is never restarted, whatever its status.
    marker.asked_to_stop = code == kStopFailedExitStatus ||
                           (g_told_to_stop == 0 && (signal == SIGTERM || signal == SIGINT || signal == SIGUSR1));
    write_all(STDERR_FILENO, exit_marker(marker) + "\n");
    if (const char* dir = std::getenv(kExitDirVariable)) {
      const std::string path = std::string(dir) + "/rank-" + std::to_string(rank);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) {
        write_all(fd, exit_marker(marker) + "\n");
        ::close(fd);
      }
    }
  }
  // ddprun learns of the stop from the marker; to mpirun it is a normal end (it would abort the others' ends
  // and print its failure banner for a non-zero status).
  return code == kStoppedExitStatus ? 0 : code;
}

namespace {

// A ddprun that runs a job: its name is ddprun and it is neither a rank's wrapper nor a --dump like us.
bool runs_a_job(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  std::string comm = read_text(dir + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  if (comm != "ddprun") return false;
  std::string cmdline = read_text(dir + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return cmdline.find(std::string(" ") + kRankWrapperFlag) == std::string::npos &&
         cmdline.find(" --dump") == std::string::npos;
}

std::vector<pid_t> running_jobs() {
  std::vector<pid_t> jobs;
  for (pid_t pid : process_ids()) {
    if (pid == ::getpid()) continue;
    struct stat info {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &info) != 0 || info.st_uid != ::getuid()) continue;
    if (runs_a_job(pid)) jobs.push_back(pid);
  }
  return jobs;
}

}  // namespace

int dump_job(const std::vector<std::string>& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "ddprun: error: --dump takes at most one pid: ddprun --dump [PID]\n");
    return 2;
  }
  pid_t pid = 0;
  if (args.size() == 1) {
    char* end = nullptr;
    const long value = std::strtol(args[0].c_str(), &end, 10);
    if (end == args[0].c_str() || *end != '\0' || value <= 0) {
      std::fprintf(stderr, "ddprun: error: --dump %s: not a pid (ddprun --dump [PID])\n", args[0].c_str());
      return 2;
    }
    pid = static_cast<pid_t>(value);
    if (!runs_a_job(pid)) {
      std::fprintf(stderr, "ddprun: --dump %d: no ddprun running a job has this pid\n", static_cast<int>(pid));
      return 1;
    }
  } else {
    const std::vector<pid_t> jobs = running_jobs();
    if (jobs.size() != 1) {
      std::string list;
      for (pid_t p : jobs) list += " " + std::to_string(p);
      std::fprintf(stderr, "ddprun: --dump: %s; name one: ddprun --dump PID\n",
                   jobs.empty() ? "no ddprun of yours is running a job"
                                : ("several ddprun jobs of yours are running (pids" + list + ")").c_str());
      return 1;
    }
    pid = jobs[0];
  }
  if (::kill(pid, kDumpSignal) != 0) {
    std::fprintf(stderr, "ddprun: --dump: cannot signal %d: %s\n", static_cast<int>(pid), std::strerror(errno));
    return 1;
  }
  std::fprintf(stderr, "ddprun: asked the job of ddprun %d for its flight recorders (SIGUSR2): each rank prints "
               "its last collectives and its phase to that job's output\n", static_cast<int>(pid));
  return 0;
}

}  // namespace launcher
}  // namespace ddp
