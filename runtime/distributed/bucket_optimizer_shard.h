// BucketOptimizerShard: ZeRO stage 1 over DistributedDataParallel's buckets — the OptimizerShard the sharded DDP
// gives the ParameterStore (see runtime/autograd/optimizer_shard.h).
//
// Who owns what: the bucket plan is made with shards = N, so every bucket is padded to a multiple of
// N·kSlotAlignment elements and rank r owns slice r of every bucket (BucketPlan::shard_of). The reducer
// reduce-scatters each bucket into those slices while backward runs; the optimizer updates rank r's slices only,
// with state for them alone (sum over buckets of count/N elements per state buffer: ceil(total/N) of the padded
// flat buffer); and this class all-gathers each bucket's updated parameters, in place, as soon as the optimizer
// has queued that bucket's update, so bucket b's all-gather runs while bucket b+1 is being updated
// (overlapped with the optimizer; the step ends waiting for the last ones, before the next forward).
//
// Host collectives (the gradient norm's sum, checkpoint gathers) go over a communicator of its own, duplicated
// from the world's, on the calling thread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>
#include <vector>

#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/reducer.h"
#include "runtime/distributed/world.h"

namespace ddp {

class BucketOptimizerShard : public OptimizerShard {
 public:
  // `plan` must have shards = group.size(); `parameters` is the flat parameter buffer laid out by it.
  BucketOptimizerShard(ProcessGroup& group, const World& world, BucketPlan plan, CommBuffer parameters,
                    const Stream& compute);
  ~BucketOptimizerShard() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<FlatSpan>& owned(int rank) const override;
  void span_updated(std::size_t k, const Stream& stream) override;
  void finish_update(const Stream& stream) override;
  double sum(double value) override;
  void gather_to_first(FlatSpan range, const float* local, float* out) override;

  // Timing of the last step's all-gathers (on a GPU, the first call after a step waits for that step).
  const GatherStats& last_stats();

 private:
  ProcessGroup& group_;
  BucketPlan plan_;
  CommBuffer parameters_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<std::vector<FlatSpan>> owned_;  // per rank: slice r of every bucket
  std::vector<std::shared_ptr<Work>> works_;  // this step's all-gathers, per bucket
  std::int64_t steps_ = 0;  // optimizer steps, for the watchdog's messages

  Event waits_begin_, waits_end_;  // CUDA: the exposed wait, measured on the device
  GatherStats stats_;
  bool stats_pending_ = false;
};

}  // namespace ddp
