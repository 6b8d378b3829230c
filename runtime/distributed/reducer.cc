#include "runtime/distributed/reducer.h"

#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/kernels/dispatch.h"
#include "runtime/core/phase.h"

namespace ddp {

Reducer::Reducer(ProcessGroup& group, BucketPlan plan, CommBuffer gradients, const Stream& compute,
                 ReducerOptions options)
    : group_(group), plan_(std::move(plan)), gradients_(gradients), compute_(compute), options_(options) {
  DDP_CHECK(gradients_.dtype == DType::kFloat32, "the flat gradient buffer must be float32");
  DDP_CHECK(gradients_.count == plan_.total, "the flat gradient buffer has " + std::to_string(gradients_.count) +
                                                 " elements, the bucket plan lays out " +
                                                 std::to_string(plan_.total));
  DDP_CHECK(!options_.shard || (plan_.shards == group_.size() && options_.hook == nullptr),
            "a sharded reducer needs a bucket plan for " + std::to_string(group_.size()) +
                " shards (it has " + std::to_string(plan_.shards) + ") and no communication hook");
  pending_.assign(plan_.buckets.size(), 0);
  ready_.assign(plan_.offsets.size(), false);
  contributors_ = group_.size();
  if (compute_.device().is_cuda()) {
    backward_begin_ = Event::create(compute_.device(), /*timing=*/true);
    backward_end_ = Event::create(compute_.device(), /*timing=*/true);
    last_wait_begin_ = Event::create(compute_.device(), /*timing=*/true);
    comm_done_ = Event::create(compute_.device(), /*timing=*/true);
  }
}

void Reducer::set_contributors(int ranks) {
  DDP_CHECK(ranks >= 1 && ranks <= group_.size(), "set_contributors: " + std::to_string(ranks) +
                                                      " ranks, outside [1, " + std::to_string(group_.size()) + "]");
  DDP_CHECK(!in_backward_, "set_contributors during a backward");
  contributors_ = ranks;
}

Reducer::~Reducer() {
  // Collectives in flight read and write the gradient buffer: let them finish before it can go away.
  for (auto& w : works_) {
    if (!w) continue;
    try {
      w->synchronize();
    } catch (...) {
    }
  }
}

double Reducer::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - backward_start_).count();
}

void Reducer::prepare_for_backward() {
  DDP_ASSERT(!in_backward_, "prepare_for_backward called twice without finalize");
  // Deferred waits nobody took (a skipped optimizer step): this backward writes the buckets those collectives
  // still read.
  wait_all(compute_);
  waited_.clear();
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    pending_[b] = static_cast<int>(plan_.buckets[b].parameters.size());
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_bucket_ = 0;
  works_.assign(plan_.buckets.size(), nullptr);
  stats_ = ReducerStats{};
  stats_pending_ = false;
  stats_.buckets = static_cast<int>(plan_.buckets.size());
  backward_start_ = std::chrono::steady_clock::now();
  if (compute_.device().is_cuda()) backward_begin_.record(compute_);
  in_backward_ = true;
  ++steps_;
  set_current_step(steps_);
}

CommBuffer Reducer::bucket_view(std::size_t bucket) const {
  const GradientBucket& b = plan_.buckets[bucket];
  CommBuffer view = gradients_;
  view.data = static_cast<float*>(gradients_.data) + b.offset;
  view.count = b.count;
  return view;
}

void Reducer::mark_ready(std::size_t index) {
  DDP_ASSERT(in_backward_, "a gradient became ready outside backward (call prepare_for_backward first)");
  DDP_ASSERT(index < ready_.size(), "gradient hook for parameter " + std::to_string(index) + " of " +
                                       std::to_string(ready_.size()));
  DDP_ASSERT(!ready_[index], "the gradient of parameter " + std::to_string(index) +
                                " was marked ready twice in one backward");
  ready_[index] = true;
  --pending_[plan_.bucket_of[index]];
  if (sync_) launch_ready_buckets();
}

std::vector<std::size_t> Reducer::unready_parameters() const {
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < ready_.size(); ++k) {
    if (!ready_[k]) out.push_back(k);
  }
  return out;
}

void Reducer::launch_ready_buckets() {
  // Strictly in order: a later bucket that is complete waits for the earlier ones, so every rank issues the
  // same collectives in the same order whatever order its gradients became ready in.
  while (next_bucket_ < plan_.buckets.size() && pending_[next_bucket_] == 0) launch(next_bucket_++);
}

void Reducer::launch(std::size_t bucket) {
  stats_.issue_us.push_back(now_us());
  const CommBuffer view = bucket_view(bucket);
  group_.set_context(CollectiveContext{static_cast<int>(bucket), static_cast<int>(plan_.buckets.size()), view.bytes(),
                                       steps_});
  if (options_.hook != nullptr) {
    works_[bucket] = options_.hook->start(group_, bucket, view, compute_);
  } else if (options_.shard) {
    const FlatSpan mine = plan_.shard_of(bucket, group_.rank());
    CommBuffer slice = gradients_;
    slice.data = static_cast<float*>(gradients_.data) + mine.offset;
    slice.count = mine.count;
    works_[bucket] = group_.reduce_scatter(view, slice, options_.average ? ReduceOp::kAverage : ReduceOp::kSum, compute_);
  } else {
    // Averaged over fewer ranks than the group: the sum here, divided in finalize.
    const bool average_here = options_.average && contributors_ == group_.size();
    works_[bucket] = group_.all_reduce(view, average_here ? ReduceOp::kAverage : ReduceOp::kSum, compute_);
  }
  group_.set_context(CollectiveContext{});  // what comes next is no bucket's
}

void Reducer::finalize() {
  DDP_ASSERT(in_backward_, "finalize without prepare_for_backward");
  in_backward_ = false;
  for (std::size_t k = 0; k < ready_.size(); ++k) {
    DDP_CHECK(ready_[k], "parameter " + std::to_string(k) +
                             " got no gradient in this backward: every parameter must take part in the loss, "
                             "or be marked ready by the caller (DdpOptions::find_unused_parameters)");
  }
  stats_.backward_end_us = now_us();
  stats_.backward_ms = stats_.backward_end_us / 1000.0;
  if (!sync_) return;
  launch_ready_buckets();

  if (compute_.device().is_cuda()) backward_end_.record(compute_);
  host_wait_ms_ = 0;
  // Fewer contributors than ranks: a hook averaged over the group, the default all-reduce summed.
  rescale_ = 1.0f;
  if (options_.average && contributors_ != group_.size()) {
    rescale_ = options_.hook != nullptr ? static_cast<float>(group_.size()) / static_cast<float>(contributors_)
                                        : 1.0f / static_cast<float>(contributors_);
  }
  waited_.assign(works_.size(), false);
  unwaited_ = works_.size();
  if (unwaited_ == 0 && !is_capturing(compute_)) end_waits(compute_);
  if (!options_.defer_waits) wait_all(compute_);
}

void Reducer::wait_bucket(std::size_t b, const Stream& stream) {
  if (b >= waited_.size() || waited_[b]) return;
  // Never issued: the error that stopped it is on its way to the caller, and there is nothing to wait for.
  DDP_CHECK(works_[b] != nullptr, "bucket " + std::to_string(b) + "'s all-reduce was never issued");
  const bool timed = !is_capturing(stream);
  const bool last = unwaited_ == 1;
  if (options_.defer_waits && last && timed && stream.device().is_cuda()) last_wait_begin_.record(stream);
  const auto host_start = std::chrono::steady_clock::now();
  works_[b]->wait(stream);
  if (options_.hook != nullptr) options_.hook->finish(b, bucket_view(b), stream);
  if (rescale_ != 1.0f) {
    const CommBuffer view = bucket_view(b);
    DDP_DISPATCH(view.device, scale, static_cast<float*>(view.data), view.count, rescale_, stream.handle());
  }
  host_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start).count();
  waited_[b] = true;
  if (--unwaited_ == 0 && timed) end_waits(stream);
}

void Reducer::wait_all(const Stream& stream) {
  for (std::size_t b = 0; b < waited_.size(); ++b) wait_bucket(b, stream);
}

void Reducer::end_waits(const Stream& stream) {
  if (stream.device().is_cuda()) {
    // Exposed time is measured on the device, when asked for: how long the compute stream sat waiting.
    comm_done_.record(stream);
  } else {
    // Waited on the host: the time inside the waits (all of it since backward ended, unless deferred).
    stats_.exposed_comm_ms = host_wait_ms_;
  }
  stats_pending_ = true;
}

const ReducerStats& Reducer::last_stats() {
  wait_all(compute_);  // deferred waits nobody took yet
  if (!stats_pending_) return stats_;
  stats_pending_ = false;
  stats_.timed = true;
  if (compute_.device().is_cuda()) {
    comm_done_.synchronize();
    stats_.exposed_comm_ms = comm_done_.elapsed_ms_since(options_.defer_waits ? last_wait_begin_ : backward_end_);
  }
  stats_.allreduce_ms = 0;
  stats_.bucket_timings.assign(works_.size(), ReducerStats::BucketTiming{});
  for (std::size_t b = 0; b < works_.size(); ++b) {
    if (!works_[b]) continue;
    ReducerStats::BucketTiming& t = stats_.bucket_timings[b];
    t.duration_ms = works_[b]->duration_ms();
    t.start_ms = works_[b]->start_ms_since(compute_.device().is_cuda() ? &backward_begin_ : nullptr, backward_start_);
    t.bytes = static_cast<std::size_t>(plan_.buckets[b].count) * sizeof(float);
    stats_.allreduce_ms += std::max(0.0, t.duration_ms);
  }
  return stats_;
}

}  // namespace ddp
