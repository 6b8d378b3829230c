// Every collective has a deadline. A watchdog thread per process group follows the collectives in flight (and
// tells the flight recorder when each completes). When one outlives its deadline, the lowest rank that answers
// on the side channel asks every rank where it is and ends the job with one message saying which rank is behind,
// where, and what the others wait in (side_channel.h); when NCCL reports an asynchronous error, the watchdog
// aborts the communicators and ends the job from this rank with a message naming the rank and the collective.
// Without it a dead or stalled peer leaves every other rank waiting forever.
#pragma once

#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/core/deadline.h"
#include "runtime/distributed/hang_diagnosis/collective_deadline.h"
#include "runtime/distributed/process_group.h"

namespace ddp {

class Watchdog {
 public:
  // `abort` tears the communicators down (ncclCommAbort); `poll_error` returns a non-empty description of an
  // asynchronous communicator error, if any. Both are called from the watchdog thread.
  Watchdog(int rank, double timeout_s, std::function<void()> abort, std::function<std::string()> poll_error);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  // Follows `work` until it completes; `what` names it in the message if it does not.
  void watch(std::shared_ptr<Work> work, const CollectiveDescription& what);

 private:
  struct Entry {
    std::shared_ptr<Work> work;
    CollectiveDescription what;
    Deadline deadline;  // in running time: a job stopped and continued is not late
  };
  void loop();
  [[noreturn]] void fail(const std::string& message);

  int rank_;
  double timeout_s_;
  std::function<void()> abort_;
  std::function<std::string()> poll_error_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddp
