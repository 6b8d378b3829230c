#include "runtime/distributed/distributed_data_parallel.h"

#include <cstdio>

#include "runtime/autograd/autograd.h"
#include "runtime/autograd/gradient_gate.h"
#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/core/phase.h"
#include "runtime/distributed/bf16_compression_hook.h"
#include "runtime/distributed/bucket_optimizer_shard.h"
#include "runtime/distributed/distributed_data_parallel_impl.h"
#include "runtime/distributed/same_parameters.h"
#include "runtime/distributed/session.h"
#include "runtime/io/trace.h"
#include "runtime/models/module.h"

namespace ddp {
namespace {

// The session's process group (made on first use: a collective), then the model's flat buffers, in that order.
ParameterStore& group_then_parameters(Module& model, Session& session) {
  session.group();
  return model.flat_parameters(session.stream());
}

}  // namespace

// The store's GradientGate under DdpOptions::overlap_optimizer: the pieces are the buckets, a piece's wait is
// its bucket's.
class BucketGradientGate : public GradientGate {
 public:
  explicit BucketGradientGate(Reducer& reducer) : reducer_(reducer) {
    for (const GradientBucket& b : reducer.plan().buckets) boundaries_.push_back(b.offset);
    boundaries_.push_back(reducer.plan().total);
  }
  const std::vector<std::int64_t>& boundaries() const override { return boundaries_; }
  void wait_piece(std::size_t k, const Stream& stream) override { reducer_.wait_bucket(k, stream); }
  void wait_all(const Stream& stream) override { reducer_.wait_all(stream); }

 private:
  Reducer& reducer_;
  std::vector<std::int64_t> boundaries_;
};

namespace {

// Why the optimizer state cannot be sharded as asked, or "" (the same answer on every rank: the models match).
std::string shard_refusal(const std::vector<ParameterSpec>& specs, const DdpOptions& options, int ranks) {
  if (options.compression != GradientCompression::kNone) {
    return "DdpOptions::shard_optimizer reduce-scatters float32 gradients and cannot be combined with gradient "
           "compression: turn one of them off";
  }
  std::int64_t elements = 0;
  for (const ParameterSpec& p : specs) elements += p.numel();
  if (elements < ranks) {
    return "the optimizer state of " + std::to_string(elements) + " parameter elements cannot be sharded over " +
           std::to_string(ranks) + " ranks (each rank must own at least one): use at most " +
           std::to_string(elements) + " ranks, or turn shard_optimizer off";
  }
  return "";
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Module& model, Session& session, DdpOptions options)
    : DistributedDataParallel(group_then_parameters(model, session), session.group(), session.world(),
                              session.stream(), options) {}

DistributedDataParallel::DistributedDataParallel(ParameterStore& parameters, ProcessGroup& group,
                                                 const World& world, const Stream& compute, DdpOptions options)
    : parameters_(parameters),
      group_(group),
      compute_(compute),
      world_(world),
      options_(options),
      impl_(std::make_unique<Impl>()) {
  std::vector<ParameterSpec> specs;
  specs.reserve(parameters.size());
  for (const ParameterSlot& slot : parameters.slots()) {
    specs.push_back(ParameterSpec{slot.name, slot.shape, slot.param.dtype()});
  }
  // Before any collective that depends on the model: a mismatch ends every rank here, not in a hang later.
  verify_parameters_match(world, specs);
  // Options that differ across ranks would make the ranks issue different collectives (a sharded rank gathers,
  // an unsharded one does not: a hang) or train differently: refused here, naming the option and the ranks.
  auto text = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.17g", v);
    return std::string(buffer);
  };
  world.agree_same({{"DdpOptions::bucket_cap_mb", text(options.bucket_cap_mb)},
                    {"DdpOptions::first_bucket_cap_mb", text(options.first_bucket_cap_mb)},
                    {"DdpOptions::broadcast_parameters", options.broadcast_parameters ? "true" : "false"},
                    {"DdpOptions::average", options.average ? "true" : "false"},
                    {"DdpOptions::compression", std::to_string(static_cast<int>(options.compression))},
                    {"DdpOptions::find_unused_parameters", options.find_unused_parameters ? "true" : "false"},
                    {"DdpOptions::shard_optimizer", options.shard_optimizer ? "true" : "false"},
                    {"DdpOptions::overlap_optimizer", options.overlap_optimizer ? "true" : "false"}},
                   "DistributedDataParallel's options differ across ranks");

  if (options.shard_optimizer) world.agree(shard_refusal(specs, options, group_.size()), "cannot shard the optimizer");
  if (options.overlap_optimizer && options.shard_optimizer) {
    throw InvalidArgument(
        "DdpOptions::overlap_optimizer and shard_optimizer cannot be combined (the sharded update already "
        "overlaps its parameter all-gathers): turn one of them off");
  }
  const int shards = options.shard_optimizer ? group_.size() : 1;
  BucketPlan plan = plan_buckets(specs, BucketOptions{options.bucket_cap_mb, options.first_bucket_cap_mb, shards});
  parameters_.relayout(plan.layout_order(), compute_, plan.offsets, plan.total);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    DDP_ASSERT(parameters_.slot(i).offset == plan.offsets[i], "parameter store layout differs from the bucket plan");
  }
  if (options.broadcast_parameters && group_.size() > 1) {
    group_.broadcast(CommBuffer::of(parameters_.flat_params()), 0, compute_)->wait(compute_);
  }

  ReducerOptions reducer_options;
  reducer_options.average = options.average;
  reducer_options.shard = options.shard_optimizer;
  reducer_options.defer_waits = options.overlap_optimizer;
  if (options.compression == GradientCompression::kBFloat16) {
    impl_->hook = std::make_unique<BFloat16CompressionHook>(CommBuffer::of(parameters_.flat_grads()), compute_);
    reducer_options.hook = impl_->hook.get();
  }
  impl_->reducer = std::make_unique<Reducer>(group_, std::move(plan), CommBuffer::of(parameters_.flat_grads()),
                                             compute_, reducer_options);
  Reducer* reducer = impl_->reducer.get();
  parameters_.add_grad_ready_hook([reducer](std::size_t index) { reducer->mark_ready(index); });
  if (options.shard_optimizer) {
    impl_->shard = std::make_shared<BucketOptimizerShard>(group_, world, impl_->reducer->plan(),
                                                          CommBuffer::of(parameters_.flat_params()), compute_);
    parameters_.set_optimizer_shard(impl_->shard);
  }
  if (options.overlap_optimizer) {
    impl_->gate = std::make_unique<BucketGradientGate>(*impl_->reducer);
    parameters_.set_gradient_gate(impl_->gate.get());
  }
  layout_version_ = parameters_.layout_version();  // after the shard: setting it counts as a new layout
}

DistributedDataParallel::~DistributedDataParallel() {
  parameters_.clear_grad_ready_hooks();
  if (impl_->shard) parameters_.set_optimizer_shard(nullptr);
  if (impl_->gate) {
    try {
      impl_->gate->wait_all(compute_);  // the store's gradients stay final without this object
    } catch (...) {
    }
    parameters_.set_gradient_gate(nullptr);
  }
}

DistributedDataParallel::Impl::~Impl() = default;

DistributedDataParallel::NoSync::NoSync(Reducer& reducer) : reducer_(&reducer) { reducer_->set_sync(false); }

DistributedDataParallel::NoSync::~NoSync() {
  if (reducer_ != nullptr) reducer_->set_sync(true);
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(*impl_->reducer); }

const BucketPlan& DistributedDataParallel::plan() const { return impl_->reducer->plan(); }

const ReducerStats& DistributedDataParallel::last_stats() { return impl_->reducer->last_stats(); }

bool DistributedDataParallel::shards_optimizer() const { return impl_->shard != nullptr; }

const GatherStats& DistributedDataParallel::last_gather_stats() {
  static const GatherStats kNone;
  return impl_->shard ? impl_->shard->last_stats() : kNone;
}

void DistributedDataParallel::backward(const Tensor& loss) {
  DDP_CHECK(parameters_.layout_version() == layout_version_,
            "the model's parameters were moved or flattened again after DistributedDataParallel was constructed "
            "(its buckets are slices of the old buffers): move and flatten the model first, then construct "
            "DistributedDataParallel");
  PhaseGuard phase(Phase::kBackward);
  if (is_capturing(compute_) && (impl_->join != nullptr || options_.find_unused_parameters)) {
    autograd::clear_tape();
    throw InvalidArgument(std::string("DistributedDataParallel::backward ") +
                          (impl_->join != nullptr
                               ? "under join counts the ranks still training on the host at each step"
                               : "with find_unused_parameters decides on the host which parameters got a gradient") +
                          ", which a captured CUDA graph would fix at the capture: run this step eagerly");
  }
  if (impl_->join != nullptr) {
    bool sync = impl_->reducer->sync();
    try {
      count_joined_step(/*training=*/true, &sync);
    } catch (...) {
      autograd::clear_tape();  // the caller may go on after InputsExhausted: this forward is not backpropagated
      throw;
    }
  }
  const double begin_us = options_.trace != nullptr ? options_.trace->now_us() : 0.0;
  impl_->reducer->prepare_for_backward();
  try {
    autograd::backward(loss, compute_);
  } catch (...) {
    end_failed_backward();
    throw;
  }
  handle_unused_parameters();
  impl_->reducer->finalize();
  if (options_.trace != nullptr) trace_step(begin_us);
}

void DistributedDataParallel::reduce_gradients() {
  DDP_CHECK(parameters_.layout_version() == layout_version_,
            "the model's parameters were moved or flattened again after DistributedDataParallel was constructed: "
            "move and flatten the model first, then construct DistributedDataParallel");
  if (impl_->join != nullptr) {
    throw InvalidArgument("DistributedDataParallel::reduce_gradients under join: backpropagate with backward()");
  }
  PhaseGuard phase(Phase::kBackward);
  impl_->reducer->prepare_for_backward();
  for (std::size_t i = 0; i < parameters_.size(); ++i) impl_->reducer->mark_ready(i);
  impl_->reducer->finalize();
}

void DistributedDataParallel::end_failed_backward() {
  // Leaves the reducer consistent for the caller's error handling (ready for the next prepare_for_backward);
  // the collectives already issued complete. Its own error, if any, is the one being reported.
  try {
    impl_->reducer->finalize();
  } catch (...) {
  }
}

void DistributedDataParallel::handle_unused_parameters() {
  const std::vector<std::size_t> unused = impl_->reducer->unready_parameters();
  if (unused.empty()) return;
  if (!options_.find_unused_parameters) {
    std::string names;
    for (std::size_t i : unused) names += (names.empty() ? "" : ", ") + parameters_.slot(i).name;
    end_failed_backward();
    throw InvalidArgument("step " + std::to_string(impl_->reducer->steps()) + ": parameter(s) " + names +
                          " got no gradient in this backward (they took no part in the loss on this rank); if "
                          "that is intended, construct DistributedDataParallel with "
                          "DdpOptions::find_unused_parameters = true");
  }
  for (std::size_t i : unused) {
    // Contents that only count as zero (zero_grad) may be stale, and the all-reduce reads them.
    autograd::use_zero_gradient(parameters_.slot(i).param, compute_);
    impl_->reducer->mark_ready(i);
  }
}

void DistributedDataParallel::trace_step(double begin_us) {
  io::TraceRecorder& trace = *options_.trace;
  const ReducerStats& stats = impl_->reducer->last_stats();
  trace.complete(trace.track("compute"), "backward", "compute", begin_us, stats.backward_ms * 1000.0,
                 {{"step", impl_->reducer->steps()}, {"exposed_comm_ms", stats.exposed_comm_ms}});
  const int comm = trace.track("comm");
  for (std::size_t b = 0; b < stats.bucket_timings.size(); ++b) {
    const auto& t = stats.bucket_timings[b];
    if (t.start_ms < 0) continue;
    trace.complete(comm, impl_->shard ? "reduce_scatter" : "allreduce", "comm", begin_us + t.start_ms * 1000.0,
                   t.duration_ms * 1000.0,
                   {{"bucket", b}, {"bytes", t.bytes}, {"step", impl_->reducer->steps()}});
  }
}

}  // namespace ddp
