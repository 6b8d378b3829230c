#include "runtime/distributed/watchdog.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "runtime/core/check.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/hang_diagnosis/side_channel.h"
#include "runtime/distributed/process_group.h"

namespace ddp {

Watchdog::Watchdog(int rank, double timeout_s, std::function<void()> abort,
                   std::function<std::string()> poll_error)
    : rank_(rank), timeout_s_(timeout_s), abort_(std::move(abort)), poll_error_(std::move(poll_error)) {
  DDP_CHECK(timeout_s > 0, "the collective timeout must be positive");
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch(std::shared_ptr<Work> work, const CollectiveDescription& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Entry{std::move(work), what, Deadline(timeout_s_)});
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    for (auto it = entries_.begin(); it != entries_.end();) {
      Work& work = *it->work;
      if (work.is_completed()) {
        if (std::exception_ptr error = work.exception()) {
          std::string text = "unknown error";
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            text = e.what();
          }
          fail(it->what.text() + " failed: " + text);
        }
        record_collective_completed(it->what.seq);
        it = entries_.erase(it);
        continue;
      }
      if (it->deadline.passed()) {
        end_job_after_timeout(rank_,
                              it->what.text() + " did not complete within " + timeout_text(timeout_s_) +
                                  " (DDP_COLLECTIVE_TIMEOUT_S)",
                              abort_);
      }
      ++it;
    }
    if (!entries_.empty() && poll_error_) {
      const std::string error = poll_error_();
      if (!error.empty()) fail(entries_.front().what.text() + ": communicator error: " + error);
    }
  }
}

void Watchdog::fail(const std::string& message) {
  std::fprintf(stderr, "rank %d: fatal: %s; aborting the job\n", rank_, message.c_str());
  std::fflush(stderr);
  if (abort_) abort_();
  // Ends every rank: mpirun tears the job down when one process aborts.
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace ddp
