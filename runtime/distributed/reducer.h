// The gradient reducer: launches each bucket's all-reduce (or, sharded, reduce-scatter) the moment its last
// gradient is final, while backward is still running, strictly in bucket order on every rank (so all ranks issue
// the same sequence of collectives), and makes the compute stream wait for them before the optimizer —
// device-side on GPUs.
//
// Data model (after PyTorch's c10d reducer): one flat float32 gradient buffer laid out by a BucketPlan; a
// bucket is a slice of it; a pending count per bucket; a cursor to the next bucket to launch.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "runtime/core/stream.h"
#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/process_group.h"

namespace ddp {

// How a bucket is communicated, as PyTorch's DDP communication hooks: `start` issues the collective for the
// bucket (a slice of the flat gradient buffer) after the work queued on `compute`; `finish` runs once the
// compute stream waits for it and may post-process the bucket (e.g. decompress). The default all-reduces in
// float32 and averages.
class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::shared_ptr<Work> start(ProcessGroup& group, std::size_t bucket, const CommBuffer& gradients,
                                      const Stream& compute) = 0;
  virtual void finish(std::size_t bucket, const CommBuffer& gradients, const Stream& compute) = 0;
};

struct ReducerOptions {
  // Average (PyTorch DDP's behaviour) or sum the gradients; used by the default hook.
  bool average = true;
  // Replaces the default all-reduce (for example bfloat16 compression); the reducer does not own it.
  CommHook* hook = nullptr;
  // ZeRO stage 1: each bucket is reduce-scattered (in place) instead of all-reduced, so that rank r holds the
  // averaged gradients of its slice plan.shard_of(b, r) of every bucket and the rest of the buffer is left
  // undefined. Needs a plan made with shards = the group's size; no hook.
  bool shard = false;
  // finalize() leaves each bucket's wait to wait_bucket()/wait_all() (DdpOptions::overlap_optimizer: the
  // optimizer updates a bucket as soon as its own collective is done). prepare_for_backward() and last_stats()
  // wait for what is left.
  bool defer_waits = false;
};

// Per-step timing, in milliseconds. `exposed_comm_ms` is the time the compute stream (or thread) waited for
// communication after backward ended: zero when all of it was hidden under backward. With deferred waits it
// is the wait for the last bucket, after the work queued before it (the optimizer's earlier buckets).
struct ReducerStats {
  // False for a backward captured into a CUDA graph: its events are graph nodes with no times of their own, so
  // none of the figures below is measured (they stay zero).
  bool timed = false;
  double backward_ms = 0;
  double allreduce_ms = 0;  // sum over buckets of each all-reduce's own duration
  double exposed_comm_ms = 0;
  int buckets = 0;
  // Host times (microseconds since backward began) at which each bucket's all-reduce was issued, and when
  // backward ended: the overlap test reads these.
  std::vector<double> issue_us;
  double backward_end_us = 0;
  // Per bucket: when its all-reduce ran (ms after backward began, on the communication stream or thread),
  // how long it took, and its size.
  struct BucketTiming {
    double start_ms = -1;
    double duration_ms = -1;
    std::size_t bytes = 0;
  };
  std::vector<BucketTiming> bucket_timings;
};

// Sharded optimizer (DdpOptions::shard_optimizer): how much of the last step's parameter all-gathers was hidden
// under the optimizer, in milliseconds.
struct GatherStats {
  bool timed = false;     // false before the first sharded step and for steps captured into a CUDA graph
  double gather_ms = 0;   // sum over buckets of each all-gather's own duration
  double exposed_ms = 0;  // how long the compute stream (or thread) waited for them after the last update
};

class Reducer {
 public:
  // `gradients` is the flat buffer laid out by `plan` (plan.total float32 elements on the process group's
  // device); `compute` is the stream backward runs on.
  Reducer(ProcessGroup& group, BucketPlan plan, CommBuffer gradients, const Stream& compute,
          ReducerOptions options = {});
  ~Reducer();

  const BucketPlan& plan() const { return plan_; }

  // Starts a step: every bucket pending again. Call before backward.
  void prepare_for_backward();
  // The autograd hook: parameter `index` (registration order) has its final gradient for this backward.
  void mark_ready(std::size_t index);
  // After backward: launches what is left, then orders the compute stream after every bucket's all-reduce
  // (unless ReducerOptions::defer_waits). Throws if some parameter never got a gradient (a parameter unused in
  // forward), naming it.
  void finalize();
  // Orders `stream` after bucket `bucket`'s collective (and its hook's finish and rescaling): once per bucket
  // and backward; nothing for a bucket already waited for, or when no backward is pending.
  void wait_bucket(std::size_t bucket, const Stream& stream);
  void wait_all(const Stream& stream);
  // During backward: the parameters (registration indices) whose gradients are not marked ready yet.
  std::vector<std::size_t> unready_parameters() const;
  // Skips communication for the next backward(s): gradients accumulate locally (DDP's no_sync).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // How many ranks' gradients the next backwards average (with average on): the group's size, or fewer when
  // the other ranks contribute zeros in their place (join), so that the result is the mean of these ranks.
  void set_contributors(int ranks);

  // Timing of the last step. On a GPU the first call after a step waits for that step's communication to
  // finish (the step itself never blocks the host): read it when logging, not every step.
  const ReducerStats& last_stats();
  // Backward passes started so far (the step number in error messages).
  long long steps() const { return steps_; }

 private:
  void launch_ready_buckets();
  void launch(std::size_t bucket);
  // After the last bucket's wait: marks the step's device timings for last_stats().
  void end_waits(const Stream& stream);
  CommBuffer bucket_view(std::size_t bucket) const;
  double now_us() const;

  ProcessGroup& group_;
  BucketPlan plan_;
  CommBuffer gradients_;
  const Stream& compute_;
  ReducerOptions options_;
  bool sync_ = true;
  bool in_backward_ = false;
  int contributors_ = 0;  // set_contributors; the group's size by default

  std::vector<int> pending_;           // per bucket: gradients not yet final
  std::vector<bool> ready_;            // per parameter, this backward
  std::size_t next_bucket_ = 0;        // buckets launch strictly in order
  std::vector<std::shared_ptr<Work>> works_;
  Event backward_begin_;
  Event backward_end_;
  Event last_wait_begin_;  // deferred waits: the stream reached the last bucket's wait
  Event comm_done_;
  std::vector<bool> waited_;    // per bucket, this backward; empty when nothing is pending
  std::size_t unwaited_ = 0;
  float rescale_ = 1.0f;        // this backward's factor for the buckets (fewer contributors than ranks)
  double host_wait_ms_ = 0;     // on the CPU: time spent in the waits
  std::chrono::steady_clock::time_point backward_start_;
  ReducerStats stats_;
  bool stats_pending_ = false;  // device-side timings not read yet
  long long steps_ = 0;
};

}  // namespace ddp
