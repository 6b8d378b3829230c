// TrainingThread: an in-situ program's training rounds on a host thread of their own, so that the simulation's
// thread only hands each round over and goes on. Launching a round's work (scoring the new samples, storing them,
// a dozen training steps) takes a host thread longer than the solver's own steps; on one GPU both then wait for
// it. Header only: examples/in_situ_surrogate.cc uses it.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace in_situ {

// Rounds handed over by step number. A round is `take` (the samples scored and stored: after it the solver may
// draw over them) then `train`. Rounds run in the order handed over, so the run computes what it computes on one
// thread. An exception in a round ends the thread and is thrown again on the solver's thread at its next call.
class TrainingThread {
 public:
  TrainingThread(std::function<void(long long)> take, std::function<void(long long)> train)
      : take_(std::move(take)), train_(std::move(train)), thread_([this] { run(); }) {}
  ~TrainingThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  TrainingThread(const TrainingThread&) = delete;
  TrainingThread& operator=(const TrainingThread&) = delete;

  void hand_over(long long step) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      rethrow_failure();
      rounds_.push_back(step);
      ++handed_;
    }
    changed_.notify_all();
  }
  // Blocks until every round handed over has had its samples taken (and the event after them recorded).
  void wait_taken() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return taken_ == handed_ || failure_ != nullptr; });
    rethrow_failure();
  }
  // Blocks until every round handed over is done.
  void wait_done() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return (rounds_.empty() && !busy_) || failure_ != nullptr; });
    rethrow_failure();
  }

 private:
  void run() {
    for (;;) {
      long long step = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !rounds_.empty() || closing_; });
        if (rounds_.empty()) return;
        step = rounds_.front();
        rounds_.pop_front();
        busy_ = true;
      }
      try {
        take_(step);
        mark([&] { ++taken_; });
        train_(step);
        mark([&] { busy_ = false; });
      } catch (...) {
        mark([&] { failure_ = std::current_exception(); });
        return;
      }
    }
  }
  template <typename Change>
  void mark(Change change) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      change();
    }
    changed_.notify_all();
  }
  void rethrow_failure() const {
    if (failure_ != nullptr) std::rethrow_exception(failure_);
  }

  std::function<void(long long)> take_, train_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<long long> rounds_;
  long long handed_ = 0, taken_ = 0;
  bool busy_ = false, closing_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: it starts once everything above is made
};
}  // namespace in_situ
