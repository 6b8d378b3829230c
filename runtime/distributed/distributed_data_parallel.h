// DistributedDataParallel: PyTorch DDP's behaviour over a model's ParameterStore. At construction every rank
// checks it holds the same parameters (names, shapes, dtypes, order), the store is re-laid in bucket order (so
// each bucket is a slice of the flat gradient buffer), and rank 0's parameters are broadcast. Each
// `backward(loss)` then all-reduces buckets as their gradients become final, averaged, overlapping the rest of
// backward, and leaves the compute stream ordered after the last bucket: the optimizer can follow at once.
//
//   ddp::DistributedDataParallel ddp(model, session);  // flattens the model if nobody has yet
//   loss = ...forward...;
//   ddp.backward(loss);          // instead of autograd::backward(loss, stream)
//   optimizer.step(stream);
//
// Order: the optimizer may be made before or after DDP (one made before follows the bucket layout, as long as
// it has not stepped yet; after a step it refuses, saying so). Moving or re-flattening the model after DDP was
// made is refused at the next backward.
//
// `no_sync()` accumulates gradients locally for gradient accumulation; the backward after the guard ends
// all-reduces the sum. `join(loop)` runs a loop whose ranks have different numbers of batches (join.h).
//
// DdpOptions::shard_optimizer (ZeRO stage 1) shards the optimizer state over the ranks: each bucket is
// reduce-scattered instead of all-reduced (rank r gets the average of its slice of every bucket), an optimizer
// made on the store afterwards keeps state for those slices only and updates them alone, and the updated
// parameters are all-gathered bucket by bucket while the optimizer works on the next one (see
// bucket_optimizer_shard.h). The user's loop is unchanged; the gradients outside this rank's slices are undefined
// after backward (clip_grad_norm knows, and sums its norm over the ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace ddp {

class Module;
class ParameterStore;
class ProcessGroup;
class Reducer;
class Session;
class Stream;
class Tensor;
class World;
struct BucketPlan;
struct GatherStats;
struct JoinOptions;
struct ReducerStats;
namespace io {
class TraceRecorder;
}

enum class GradientCompression { kNone, kBFloat16 };

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  bool broadcast_parameters = true;  // rank 0's initial parameters on every rank
  bool average = true;               // average (PyTorch) or sum the gradients
  GradientCompression compression = GradientCompression::kNone;
  // PyTorch's find_unused_parameters. Off: a parameter that got no gradient in a backward (its part of the
  // model did not take part in the loss on this rank) is an error naming it. On: after backward, such a
  // parameter counts as ready with a zero gradient (or, under no_sync accumulation, with what earlier backwards
  // accumulated), so the ranks that did use it get the average over all ranks, zeros included, as in PyTorch.
  // One difference: a parameter no rank used gets a zero gradient here, where PyTorch leaves its .grad as it
  // was so that the optimizer skips it; the fused optimizer here updates every parameter, so momentum and
  // weight decay still move it.
  bool find_unused_parameters = false;
  // When set, each backward adds a `backward` span (category compute) and one `allreduce` span per bucket
  // (category comm, with bucket index and bytes) to this recorder. Reading device timings waits for the step.
  io::TraceRecorder* trace = nullptr;
  // ZeRO stage 1 (see the file comment): optimizer state of ceil(total/N) elements per buffer on each of N
  // ranks, where total counts the flat buffer with each bucket padded to a multiple of 16·N elements. Not
  // with gradient compression. Make the optimizer (and Bf16Weights) after this object.
  bool shard_optimizer = false;
  // The optimizer's update overlaps the all-reduces: backward() returns without ordering the compute stream
  // after the buckets, and the optimizer updates each bucket as soon as its own all-reduce is done (the store
  // carries a GradientGate), so the earlier buckets' updates run while the last bucket, which only starts when
  // backward ends, is on the wire. The parameters are the same bits. What changes for the caller: between
  // backward() and the optimizer's step the gradients are not final for other readers; clip_grad_norm and
  // zero_grad wait for them, code of one's own calls parameters.wait_for_gradients(stream) first. Not with
  // shard_optimizer or join().
  bool overlap_optimizer = false;
};

class DistributedDataParallel {
 public:
  // `model`'s parameters (flattened here when the model is not yet), over the session's process group, with
  // the session's stream as the compute stream. Collective: every rank constructs it at the same point. Throws
  // CollectiveError (every rank) when the models differ across ranks.
  DistributedDataParallel(Module& model, Session& session, DdpOptions options = {});
  // The same over a ParameterStore, a process group and a stream of one's own, for the runtime's own code and
  // tests: World is internal (runtime/distributed/world.h; session.world() hands it out). `compute` must outlive
  // this.
  DistributedDataParallel(ParameterStore& parameters, ProcessGroup& group, const World& world,
                          const Stream& compute, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Backward of `loss` (a one-element float32 tensor) on the compute stream, with the gradients all-reduced
  // (averaged, unless DdpOptions::average is off) as they become final. Returns once everything is enqueued:
  // the compute stream is ordered after the last bucket, so the optimizer can be enqueued at once; on the CPU
  // the gradients are final on return. (With DdpOptions::overlap_optimizer the optimizer's step does that
  // ordering bucket by bucket instead.) Every rank must call it the same number of times. Throws
  // InvalidArgument when a parameter got no gradient (see find_unused_parameters) or the parameters were
  // re-laid out since construction.
  void backward(const Tensor& loss);
  // backward() for gradients a pass of one's own wrote into the parameters' gradients instead of autograd (a
  // fused kernel, FusedMlpMse): every gradient is final at once, and the buckets are all-reduced in their order.
  // Every rank calls it where the others call backward(). Not under join.
  void reduce_gradients();

  // While a NoSync guard lives, backward() accumulates gradients locally (no communication).
  class NoSync {
   public:
    explicit NoSync(Reducer& reducer);
    NoSync(NoSync&& other) noexcept : reducer_(other.reducer_) { other.reducer_ = nullptr; }
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Reducer* reducer_;
  };
  NoSync no_sync();

  // Runs `loop`, this rank's training loop over its own batches, and returns once every rank's loop has
  // returned: a rank out of data takes part in the others' remaining steps with zero gradients, and every rank
  // ends with the same parameters (join.h). Under options.throw_on_early_termination, every rank raises
  // InputsExhausted at the first step some rank is out of data. A CUDA graph cannot capture a backward in
  // `loop` (each one reads the count of ranks on the host).
  // The options are JoinOptions' defaults without them (JoinOptions: runtime/distributed/join.h).
  void join(const std::function<void()>& loop);
  void join(const std::function<void()>& loop, const JoinOptions& options);

  // How the gradients are bucketed (runtime/distributed/bucket_plan.h).
  const BucketPlan& plan() const;
  // Timing of the last backward (Reducer::last_stats in runtime/distributed/reducer.h: on a GPU the first call
  // waits for that step).
  const ReducerStats& last_stats();
  // Sharded: how much of the last step's parameter all-gathers the optimizer hid (GatherStats in
  // runtime/distributed/bucket_optimizer_shard.h).
  const GatherStats& last_gather_stats();
  bool shards_optimizer() const;
  ProcessGroup& group() { return group_; }

 private:
  // After autograd: parameters without a gradient in this backward get a zero one and are marked ready
  // (find_unused_parameters), or are named in an error.
  void handle_unused_parameters();
  // Ends a backward that failed, so that the caller's error handling finds the reducer consistent.
  void end_failed_backward();
  void trace_step(double begin_us);
  // Under join: the collective count, at each step, of the ranks still in their loop (`training`: this one
  // is) and of those of them that synchronise gradients this step; sets the reducer's divisor, and throws
  // InputsExhausted (throw_on_early_termination) or a CollectiveError (ranks disagree on no_sync) on every
  // rank alike. Returns false once no rank is training.
  bool count_joined_step(bool training, bool* sync);
  // A step of a rank out of data: zero gradients all-reduced bucket by bucket as the others' backward does.
  void backward_with_zero_gradients();
  // After a join: every rank takes the parameters of the lowest rank that trained longest.
  void broadcast_from_last_joiner(bool last_joiner);

  ParameterStore& parameters_;
  std::int64_t layout_version_ = 0;  // the store's layout the reducer's buckets are slices of
  ProcessGroup& group_;
  const Stream& compute_;
  const World& world_;
  DdpOptions options_;
  struct Impl;  // the reducer, the comm hook, the gradient gate, the optimizer shard
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
