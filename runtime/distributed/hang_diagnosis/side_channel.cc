#include "runtime/distributed/hang_diagnosis/side_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/core/deadline.h"
#include "runtime/distributed/hang_diagnosis/stall_report.h"
#include "runtime/distributed/mpi_nccl_errors.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

// How long a rank waits for the others' answers when it reports a hang, and for a coordinator's "OK". A
// coordinator on this machine whose process runs gets the longer wait: a loaded machine can keep its answering
// thread from running for a second or more, and taking that silence for a stop would make two reports.
constexpr double kGatherTimeoutS = 2.0;
constexpr double kAskTimeoutS = 1.0;
constexpr double kAskRunningTimeoutS = 10.0;
// How long a rank waits, when a lower rank does not take its request to report, for the launcher to end the job.
constexpr double kExitedGraceS = 5.0;
// How long the rank that printed the report spends telling the others (their kernels take the message even from
// a stopped process's listener; no answer is awaited beyond this).
constexpr double kEndedNoticeS = 0.3;
// Per rank, the head start a rank that timed out before the side channel existed gives the ranks below it.
constexpr double kStartStaggerS = 1.0;
// Collectives still in flight are always sent; this many completed ones before them.
constexpr std::size_t kCollectivesSent = 32;
constexpr std::size_t kCollectivesDumped = 12;
constexpr int kMaxAddresses = 4;

// What each rank tells the others at start, exchanged over MPI as bytes.
struct Endpoint {
  char node[64];
  char boot_id[40];  // with the PID namespace, whether `pid` names the process in this machine's /proc
  std::uint64_t pid_namespace;
  std::int32_t pid;
  std::int32_t world_rank;  // in MPI_COMM_WORLD: what ddprun's prefixes number (the session's may be a split)
  std::uint32_t addresses[kMaxAddresses];  // IPv4, network order
  std::uint64_t token;
  std::uint16_t port;  // 0: no listener
  std::uint8_t address_count;
};

std::atomic<SideChannel*> g_job_channel{nullptr};
std::atomic<int> g_wake_fd{-1};  // where the SIGUSR2 handler writes

void on_sigusr2(int) {
  const int saved = errno;
  const char byte = 'D';
  const int fd = g_wake_fd.load();
  if (fd >= 0 && ::write(fd, &byte, 1) < 0) {
  }  // the pipe is full: a dump is already coming
  errno = saved;
}

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

std::string node_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// The boot of this machine (/proc/sys/kernel/random/boot_id) and this process's PID namespace: two processes
// that share both see each other under the same pid in /proc. Empty and 0 where /proc does not tell.
std::string boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id;
}

std::uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

// The IPv4 addresses of this node's interfaces that are up, loopback excepted: how ranks elsewhere reach us.
std::vector<std::uint32_t> local_ipv4_addresses() {
  std::vector<std::uint32_t> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr && out.size() < kMaxAddresses; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP) || (a->ifa_flags & IFF_LOOPBACK)) continue;
    out.push_back(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
  }
  ::freeifaddrs(list);
  return out;
}

// A listening socket on every interface, on a port the kernel picks; -1 when sockets are not available.
int open_listener(std::uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(address.sin_port);
  return fd;
}

// ---- Asking several ranks at once ----

struct Target {
  std::vector<std::uint32_t> addresses;
  std::uint16_t port = 0;
};

struct Answer {
  bool ok = false;
  std::string reply;
  std::string why_not;
  bool silent = false;  // not ok: a connection was taken but no reply came (a stopped or stuck process)
};

// How an attempt on one address ended, worst news last: the order decides what is said of a rank none of
// whose addresses answered.
enum class Failure { kNone, kOther, kRefused, kClosed, kNoConnection, kNoAnswer };

struct Attempt {
  std::size_t target = 0;
  int fd = -1;
  bool connected = false;
  std::size_t sent = 0;
  std::string reply;
  bool finished = false;  // the peer closed after its reply, or the attempt failed
  Failure failure = Failure::kNone;
  std::string error;
};

std::string failure_text(Failure failure, const std::string& error, double timeout_s) {
  const std::string within = format_seconds(timeout_s);
  switch (failure) {
    case Failure::kNoAnswer:
      return "no answer within " + within + ": stopped, or stuck without its answering thread";
    case Failure::kNoConnection:
      return "no connection within " + within + ": its host is down or unreachable";
    case Failure::kClosed:
      return "it closed the connection without answering";
    case Failure::kRefused:
      return "connection refused: the process has exited";
    case Failure::kOther:
    case Failure::kNone:
      break;
  }
  return error.empty() ? "no answer" : error;
}

void fail(Attempt& a, Failure failure, const std::string& error = "") {
  a.finished = true;
  a.failure = failure;
  a.error = error;
  if (a.fd >= 0) ::close(a.fd);
  a.fd = -1;
}

// One non-blocking connection per address of every target that has a side channel; a target without one gets
// its reason in `answers`.
std::vector<Attempt> start_connections(const std::vector<Target>& targets, std::vector<Answer>* answers) {
  std::vector<Attempt> attempts;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    if (targets[t].port == 0) {
      (*answers)[t].why_not = "it has no side channel (it could not listen)";
      continue;
    }
    if (targets[t].addresses.empty()) {
      (*answers)[t].why_not = "it has no address that other nodes can reach (no network interface but loopback)";
      continue;
    }
    for (std::uint32_t address : targets[t].addresses) {
      Attempt a;
      a.target = t;
      a.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (a.fd < 0) {
        fail(a, Failure::kOther, std::string("socket: ") + std::strerror(errno));
        attempts.push_back(a);
        continue;
      }
      sockaddr_in peer{};
      peer.sin_family = AF_INET;
      peer.sin_addr.s_addr = address;
      peer.sin_port = htons(targets[t].port);
      if (::connect(a.fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) == 0) {
        a.connected = true;
      } else if (errno != EINPROGRESS) {
        fail(a, errno == ECONNREFUSED ? Failure::kRefused : Failure::kOther, std::string("connect: ") + std::strerror(errno));
      }
      attempts.push_back(a);
    }
  }
  return attempts;
}

// One step of `a` once poll says its socket is ready: finish connecting, send more of `request`, or read more of
// the reply; a reply complete (the peer closed after it) becomes its target's answer.
void advance(Attempt& a, const std::string& request, std::vector<Answer>* answers) {
  if (!a.connected) {
    int error = 0;
    socklen_t length = sizeof error;
    ::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      fail(a, error == ECONNREFUSED ? Failure::kRefused : Failure::kOther, std::string("connect: ") + std::strerror(error));
      return;
    }
    a.connected = true;
  }
  if (a.sent < request.size()) {
    const ssize_t n = ::send(a.fd, request.data() + a.sent, request.size() - a.sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      fail(a, Failure::kClosed);
    } else if (n > 0) {
      a.sent += static_cast<std::size_t>(n);
    }
    return;
  }
  char buffer[8192];
  const ssize_t n = ::recv(a.fd, buffer, sizeof buffer, 0);
  if (n > 0) {
    a.reply.append(buffer, static_cast<std::size_t>(n));
  } else if (n == 0) {
    if (a.reply.empty()) {
      fail(a, Failure::kClosed);
    } else {
      (*answers)[a.target].ok = true;
      (*answers)[a.target].reply = a.reply;
      fail(a, Failure::kNone);
    }
  } else if (errno != EAGAIN && errno != EINTR) {
    fail(a, Failure::kClosed);
  }
}

// After the deadline: what is said of each target that did not answer, from the worst news of its addresses.
void explain_failures(std::vector<Attempt>& attempts, double timeout_s, std::vector<Answer>* answers) {
  std::vector<Failure> worst(answers->size(), Failure::kNone);
  std::vector<std::string> errors(answers->size());
  for (Attempt& a : attempts) {
    if (!a.finished) {
      fail(a, a.connected ? Failure::kNoAnswer : Failure::kNoConnection);
    }
    if (a.failure >= worst[a.target]) {
      worst[a.target] = a.failure;
      errors[a.target] = a.error;
    }
  }
  for (std::size_t t = 0; t < answers->size(); ++t) {
    Answer& answer = (*answers)[t];
    if (!answer.ok && answer.why_not.empty()) answer.why_not = failure_text(worst[t], errors[t], timeout_s);
    answer.silent = !answer.ok && worst[t] == Failure::kNoAnswer;
  }
}

// Sends `request` to every target (on all of its addresses at once) and reads each reply until the peer closes.
// A target's first non-empty reply is its answer.
std::vector<Answer> ask_all(const std::vector<Target>& targets, const std::string& request, double timeout_s) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::vector<Answer> answers(targets.size());
  std::vector<Attempt> attempts = start_connections(targets, &answers);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Attempt*> polled;
    for (Attempt& a : attempts) {
      if (a.finished) continue;
      if (answers[a.target].ok) {  // another address of this target answered
        fail(a, Failure::kNone);
        continue;
      }
      const bool writing = !a.connected || a.sent < request.size();
      fds.push_back(pollfd{a.fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      polled.push_back(&a);
    }
    const double left = seconds_left(deadline);
    if (fds.empty() || left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left * 1000) + 1) < 0 && errno != EINTR) break;
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents != 0) advance(*polled[k], request, &answers);
    }
  }
  explain_failures(attempts, timeout_s, &answers);
  return answers;
}

// ---- A rank's state on the wire ----

std::string state_to_json(const RankState& s) {
  nlohmann::json j;
  j["rank"] = s.rank;
  j["host"] = s.host;
  j["pid"] = s.pid;
  j["step"] = s.step;
  j["reporting"] = s.reporting;
  nlohmann::json phases = nlohmann::json::array();
  for (const PhaseState& p : s.phases) phases.push_back({phase_name(p.phase), p.for_s});
  j["phases"] = phases;
  nlohmann::json collectives = nlohmann::json::array();
  for (const CollectiveState& c : s.collectives) {
    collectives.push_back({{"seq", c.seq}, {"op", c.operation}, {"count", c.count},
                           {"dtype", static_cast<int>(c.dtype)}, {"bucket", c.bucket}, {"buckets", c.buckets},
                           {"step", c.step}, {"issued", c.issued_s_ago}, {"completed", c.completed_s_ago}});
  }
  j["collectives"] = collectives;
  return j.dump();
}

RankState state_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  RankState s;
  s.answered = true;
  s.rank = j.at("rank").get<int>();
  s.host = j.at("host").get<std::string>();
  s.pid = j.at("pid").get<long long>();
  s.step = j.at("step").get<std::int64_t>();
  s.reporting = j.value("reporting", false);
  for (const auto& p : j.at("phases")) {
    PhaseState phase;
    if (!parse_phase_name(p.at(0).get<std::string>().c_str(), &phase.phase)) throw std::runtime_error("bad phase");
    phase.for_s = p.at(1).get<double>();
    s.phases.push_back(phase);
  }
  for (const auto& c : j.at("collectives")) {
    CollectiveState state;
    state.seq = c.at("seq").get<std::int64_t>();
    state.operation = c.at("op").get<std::string>();
    state.count = c.at("count").get<std::int64_t>();
    state.dtype = static_cast<DType>(c.at("dtype").get<int>());
    state.bucket = c.at("bucket").get<int>();
    state.buckets = c.at("buckets").get<int>();
    state.step = c.at("step").get<std::int64_t>();
    state.issued_s_ago = c.at("issued").get<double>();
    state.completed_s_ago = c.at("completed").get<double>();
    s.collectives.push_back(std::move(state));
  }
  return s;
}

std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// A reply on a socket whose sends time out (SO_SNDTIMEO): a reader that stopped reading costs a second.
void send_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

[[noreturn]] void abort_job() {
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace

std::unique_ptr<SideChannel> SideChannel::start(MPI_Comm comm) {
  std::unique_ptr<SideChannel> channel(new SideChannel());
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &channel->rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));

  Endpoint mine{};
  const std::string node = node_name();
  std::snprintf(mine.node, sizeof mine.node, "%s", node.c_str());
  const std::string boot = boot_id();
  std::snprintf(mine.boot_id, sizeof mine.boot_id, "%s", boot.c_str());
  mine.pid_namespace = pid_namespace();
  mine.pid = static_cast<std::int32_t>(::getpid());
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  mine.world_rank = world_rank;
  // Without the pipe that stops it, the answering thread could not be joined: no listener then.
  if (::pipe2(channel->wake_, O_NONBLOCK | O_CLOEXEC) == 0) {
    channel->listener_ = open_listener(&mine.port);
  } else {
    channel->wake_[0] = channel->wake_[1] = -1;
  }
  const std::vector<std::uint32_t> addresses = local_ipv4_addresses();
  mine.address_count = static_cast<std::uint8_t>(addresses.size());
  std::copy(addresses.begin(), addresses.end(), mine.addresses);
  if (channel->rank_ == 0) {
    std::random_device random;
    mine.token = (static_cast<std::uint64_t>(random()) << 32) ^ random();
  }
  std::vector<Endpoint> all(static_cast<std::size_t>(size));
  DDP_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm));
  channel->token_ = all[0].token;
  for (const Endpoint& e : all) {
    Peer peer;
    peer.node.assign(e.node, strnlen(e.node, sizeof e.node));
    peer.port = e.port;
    peer.world_rank = e.world_rank;
    if (!boot.empty() && mine.pid_namespace != 0 && std::strncmp(e.boot_id, mine.boot_id, sizeof mine.boot_id) == 0 &&
        e.pid_namespace == mine.pid_namespace) {
      peer.pid = e.pid;
    }
    // Every address is tried at once and the first answer counts (a process that is not this job's side channel
    // never answers: the token), so a name two machines share, or containers of one node, cost nothing.
    if (peer.node == mine.node) peer.addresses = {htonl(INADDR_LOOPBACK)};
    peer.addresses.insert(peer.addresses.end(), e.addresses,
                          e.addresses + std::min<int>(e.address_count, kMaxAddresses));
    channel->peers_.push_back(std::move(peer));
  }

  SideChannel* raw = channel.get();
  if (channel->wake_[0] >= 0) channel->thread_ = std::thread([raw] { raw->serve(); });

  SideChannel* none = nullptr;
  if (g_job_channel.compare_exchange_strong(none, raw) && channel->wake_[1] >= 0) {
    // SIGUSR2 becomes a dump unless the program already decided what it does.
    struct sigaction previous {};
    ::sigaction(SIGUSR2, nullptr, &previous);
    if (previous.sa_handler == SIG_DFL && !(previous.sa_flags & SA_SIGINFO)) {
      g_wake_fd.store(channel->wake_[1]);
      struct sigaction action {};
      action.sa_handler = on_sigusr2;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      ::sigaction(SIGUSR2, &action, nullptr);
      channel->routes_sigusr2_ = true;
    }
  }
  return channel;
}

SideChannel::~SideChannel() {
  if (routes_sigusr2_) {
    ::signal(SIGUSR2, SIG_DFL);
    g_wake_fd.store(-1);
  }
  SideChannel* self = this;
  g_job_channel.compare_exchange_strong(self, nullptr);
  if (wake_[1] >= 0) write_all(wake_[1], "Q");
  if (thread_.joinable()) thread_.join();
  for (int fd : {listener_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

SideChannel* job_side_channel() { return g_job_channel.load(); }

void SideChannel::serve() {
  // mpirun may signal a rank's process group, where ddprun's wrapper passes the same signal on: one dump for
  // the signals of one second.
  Clock::time_point last_dump{};
  for (;;) {
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {listener_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents & POLLIN) {
      char bytes[64];
      const ssize_t n = ::read(wake_[0], bytes, sizeof bytes);
      if (n > 0 && std::memchr(bytes, 'Q', static_cast<std::size_t>(n)) != nullptr) return;
      if (n > 0 && Clock::now() - last_dump > std::chrono::seconds(1)) {
        write_all(STDERR_FILENO, format_rank_state(local_rank_state(rank_, kCollectivesDumped)));
        last_dump = Clock::now();
      }
    }
    if (fds[1].revents & POLLIN) {
      const int connection = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection >= 0) {
        answer(connection);
        ::close(connection);
      }
    }
  }
}

// One request per connection, a line: "STATE <token>" or "STALL <token> <what>". A request without the job's
// token gets no answer.
void SideChannel::answer(int connection) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(1);
  std::string request;
  while (request.find('\n') == std::string::npos && request.size() < 4096) {
    pollfd fd{connection, POLLIN, 0};
    const double left = seconds_left(deadline);
    if (left <= 0 || ::poll(&fd, 1, static_cast<int>(left * 1000) + 1) <= 0) return;
    char buffer[1024];
    const ssize_t n = ::recv(connection, buffer, sizeof buffer, 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<std::size_t>(n));
  }
  request = request.substr(0, request.find('\n'));
  const std::string token = hex(token_);
  timeval send_timeout{1, 0};
  ::setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  if (request == "STATE " + token) {
    RankState state = local_rank_state(rank_, kCollectivesSent);
    state.reporting = reporting_.load();
    send_all(connection, state_to_json(state));
  } else if (request == "ENDED " + token) {
    reported_.store(true);
    send_all(connection, "OK\n");
  } else if (request.rfind("STALL " + token + " ", 0) == 0) {
    if (reported_.load()) {
      send_all(connection, "ENDED\n");
    } else {
      send_all(connection, "OK\n");
      start_report(request.substr(6 + token.size() + 1));
    }
  }
}

bool SideChannel::stopped(int rank) const { return peers_[rank].pid > 0 && process_stopped(peers_[rank].pid); }

std::vector<RankState> SideChannel::gather_states(double timeout_s) const {
  std::vector<RankState> states(static_cast<std::size_t>(size()));
  std::vector<Target> targets;
  std::vector<int> ranks;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    if (stopped(r)) {
      states[r].rank = r;
      states[r].no_answer = "stopped: SIGSTOP, Ctrl-Z or a debugger";
      continue;
    }
    targets.push_back(Target{peers_[r].addresses, peers_[r].port});
    ranks.push_back(r);
  }
  const std::vector<Answer> answers = ask_all(targets, "STATE " + hex(token_) + "\n", timeout_s);
  states[rank_] = local_rank_state(rank_, kCollectivesSent);
  states[rank_].reporting = reporting_.load();
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    RankState& s = states[ranks[k]];
    if (answers[k].ok) {
      try {
        s = state_from_json(answers[k].reply);
      } catch (const std::exception& e) {
        s = RankState{};
        s.no_answer = std::string("its answer could not be read: ") + e.what();
      }
    } else {
      s.no_answer = answers[k].why_not;
    }
    s.rank = ranks[k];
  }
  for (int r = 0; r < size(); ++r) states[r].world_rank = peers_[r].world_rank;
  return states;
}

SideChannel::Reply SideChannel::ask_to_report(int coordinator, const std::string& what) const {
  if (stopped(coordinator)) return Reply::kSilent;
  std::string line = what;
  std::replace(line.begin(), line.end(), '\n', ' ');
  const Peer& peer = peers_[coordinator];
  const double timeout_s = peer.pid > 0 ? kAskRunningTimeoutS : kAskTimeoutS;
  const std::vector<Answer> answers =
      ask_all({Target{peer.addresses, peer.port}}, "STALL " + hex(token_) + " " + line + "\n", timeout_s);
  if (answers[0].ok && answers[0].reply.rfind("OK", 0) == 0) return Reply::kTakes;
  if (answers[0].ok && answers[0].reply.rfind("ENDED", 0) == 0) return Reply::kEnded;
  return answers[0].silent ? Reply::kSilent : Reply::kGone;
}

void SideChannel::start_report(const std::string& what) {
  if (reporting_.exchange(true)) return;
  // Not on the answering thread: it must stay free to answer, this rank's own report asks the others.
  std::thread([this, what] { write_report_and_abort(what); }).detach();
}

void SideChannel::report_and_end_job(const std::string& what) {
  if (!reporting_.exchange(true)) write_report_and_abort(what);
  // Another thread of this rank is reporting and will end the job; if it cannot, end it from here.
  wait_for_report_then_abort(what);
}

void SideChannel::write_report_and_abort(const std::string& what) const {
  const std::vector<RankState> states = gather_states(kGatherTimeoutS);
  // A lower rank that is reporting too (its own deadline passed, or a request this rank's asker gave up on
  // reached it late) makes the one report; it ends the job.
  for (int r = 0; r < rank_; ++r) {
    if (states[r].answered && states[r].reporting) wait_for_report_then_abort(what);
  }
  if (reported_.load()) wait_for_report_then_abort(what);  // another rank printed it meanwhile
  write_all(STDERR_FILENO,
            "error: " + what + "; the job is ended. Where the ranks are:\n  " + explain_stall(states) + "\n");
  // Every other rank learns that the report is out before the job is torn down: a rank whose deadline passes
  // later, or one the teardown continues (mpirun sends SIGCONT before SIGTERM), must not report again.
  std::vector<Target> others;
  for (int r = 0; r < size(); ++r) {
    if (r != rank_) others.push_back(Target{peers_[r].addresses, peers_[r].port});
  }
  ask_all(others, "ENDED " + hex(token_) + "\n", kEndedNoticeS);
  abort_job();
}

void SideChannel::wait_for_report_then_abort(const std::string& what) const {
  std::this_thread::sleep_for(std::chrono::duration<double>(kGatherTimeoutS + 10.0));
  std::fprintf(stderr, "rank %d: fatal: %s; the report of where the ranks are did not come; aborting the job\n",
               rank_, what.c_str());
  std::fflush(stderr);
  abort_job();
}

void end_job_after_timeout(int rank, const std::string& what, const std::function<void()>& abort_communicators) {
  if (SideChannel* channel = job_side_channel(); channel != nullptr && channel->size() > 1) {
    // The lowest rank that answers makes the one report of the job; this rank may be it.
    if (channel->reported()) channel->wait_for_report_then_abort(what);
    bool waited = false;
    for (int coordinator = 0; coordinator < channel->size(); ++coordinator) {
      if (coordinator == channel->rank()) channel->report_and_end_job(what);
      SideChannel::Reply reply = channel->ask_to_report(coordinator, what);
      if (reply == SideChannel::Reply::kGone && !waited) {
        // A lower rank whose process no longer takes the request (gone, or closing) has most likely just made
        // the report and is ending the job, and the launcher is taking this process down: a second report now
        // would only repeat it. Once, wait and ask it again; if this process is still alive and it still does
        // not answer, it died without reporting: go on. One that took the connection and never answered is
        // stopped or stuck (it cannot report either): the next rank is asked at once.
        waited = true;
        std::this_thread::sleep_for(std::chrono::duration<double>(kExitedGraceS));
        reply = channel->ask_to_report(coordinator, what);
      }
      if (reply == SideChannel::Reply::kTakes || reply == SideChannel::Reply::kEnded) {
        std::this_thread::sleep_for(std::chrono::duration<double>(kGatherTimeoutS + 10.0));
        break;  // no report came: end the job from here
      }
    }
  } else {
    // No side channel yet (the session's start) and so no asking who reports: the lowest rank that waits speaks
    // first, the others give it a head start while the launcher takes the job down after its abort.
    std::this_thread::sleep_for(std::chrono::duration<double>(kStartStaggerS * std::min(rank, 16)));
  }
  std::fprintf(stderr, "rank %d: fatal: %s; another rank has probably died or stalled before it; aborting the job\n",
               rank, what.c_str());
  std::fflush(stderr);
  if (abort_communicators) abort_communicators();
  abort_job();
}

}  // namespace ddp
