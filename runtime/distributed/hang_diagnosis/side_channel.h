// A channel between the ranks that does not go through the communicators it helps to debug. When a collective
// hangs, NCCL's and MPI's communicators are stuck in it, but each rank can still be asked where it is over
// plain TCP: every rank listens on a port of its own and answers from a thread of its own, whatever its
// training thread is doing. The World starts it and exchanges the addresses over MPI (each rank advertises its
// node's IPv4 addresses; ranks of one node talk over loopback), so it works across hosts too.
//
// It carries:
//   - a rank's state (flight recorder and phase, flight_recorder.h), asked for by the rank that reports a hang;
//   - "a collective timed out here": the lowest rank that answers makes the one report of the job, printed as
//       error: rank 1's MPI_Allreduce #813 of ... did not complete within 300 s (DDP_COLLECTIVE_TIMEOUT_S); the
//       job is ended. Where the ranks are:
//         rank 2 is behind: last collective #812 (...), in data loading for 302 s; ranks 0,1,3 wait in #813 (...)
//     and then tells every other rank that the report is out (none reports again, not even one the teardown
//     continues from a stop) and ends the job (MPI_Abort);
//   - SIGUSR2: the answering thread prints this rank's flight recorder to stderr, and the job goes on.
// Requests carry a token rank 0 draws at start, so that nothing outside the job can end it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/distributed/hang_diagnosis/flight_recorder.h"

namespace ddp {

class SideChannel {
 public:
  // Collective over `comm`: opens this rank's listener, starts its answering thread, exchanges the addresses,
  // and (if nothing else has) routes SIGUSR2 to a dump. A rank that cannot listen still takes part; the others
  // then report it as unreachable. The first channel started becomes the process's job_side_channel().
  static std::unique_ptr<SideChannel> start(MPI_Comm comm);
  ~SideChannel();
  SideChannel(const SideChannel&) = delete;
  SideChannel& operator=(const SideChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  // Every rank's state, asked for in parallel (this rank's own is taken here). A rank that does not answer
  // within `timeout_s` is returned with answered = false and the reason.
  std::vector<RankState> gather_states(double timeout_s) const;
  // How a rank asked to report answered: it will (kTakes); its process took no connection, or closed it without
  // taking the request (kGone: exiting, most likely after a report of its own); it took the connection and sent
  // nothing within the timeout (kSilent: stopped, or stuck without its answering thread); another rank has
  // printed the report already (kEnded). A coordinator on this machine is looked at in /proc first: one that is
  // stopped is silent at once, one that runs gets a long wait.
  enum class Reply { kTakes, kGone, kSilent, kEnded };
  // Asks `coordinator` to report the hang `what` and end the job.
  Reply ask_to_report(int coordinator, const std::string& what) const;
  // Gathers every rank's state, prints the report of the hang `what`, ends the job. If this rank is already
  // reporting (asked by another), waits for that report to end the job.
  [[noreturn]] void report_and_end_job(const std::string& what);
  // Whether another rank has printed the report (it tells every rank before it ends the job).
  bool reported() const { return reported_.load(); }
  // Leaves the job's end to the rank that reports: if the end has not come after a while, ends it from here
  // with a line saying the report did not come.
  [[noreturn]] void wait_for_report_then_abort(const std::string& what) const;

 private:
  struct Peer {
    std::string node;
    std::uint16_t port = 0;  // 0: it has no listener
    std::vector<std::uint32_t> addresses;  // IPv4, network order; loopback first for a peer on this node
    std::int32_t pid = 0;  // > 0: a process of this machine's PID namespace, seen in /proc under this pid
    int world_rank = -1;   // its rank in MPI_COMM_WORLD
  };
  SideChannel() = default;
  void serve();
  void answer(int connection);
  void start_report(const std::string& what);
  [[noreturn]] void write_report_and_abort(const std::string& what) const;
  // Whether `rank` is a process of this machine that is stopped now.
  bool stopped(int rank) const;

  int rank_ = 0;
  std::uint64_t token_ = 0;
  std::vector<Peer> peers_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // SIGUSR2 and the destructor wake the answering thread through it
  bool routes_sigusr2_ = false;
  std::atomic<bool> reporting_{false};
  std::atomic<bool> reported_{false};  // another rank printed the report
  std::thread thread_;
};

// The side channel of this process's World; nullptr before one started, or where it could not.
SideChannel* job_side_channel();

// Called on a rank whose collective `what` ("rank 1's MPI_Allreduce #813 of ... did not complete within 2 s
// (DDP_COLLECTIVE_TIMEOUT_S)") outlived its deadline: has the lowest rank that answers report where every rank
// is and end the job. Without a side channel, or if nobody reports, this rank prints `what` and ends the job
// itself, after `abort_communicators` (may be empty). Never returns.
[[noreturn]] void end_job_after_timeout(int rank, const std::string& what,
                                        const std::function<void()>& abort_communicators);

}  // namespace ddp
