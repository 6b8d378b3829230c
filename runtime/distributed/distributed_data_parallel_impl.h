// What DistributedDataParallel keeps behind its implementation pointer: the reducer, the comm hook, the
// gradient gate and the optimizer shard. Apart from distributed_data_parallel.h so that a user's compile
// (ddp.h) reads none of their headers; join.cc, which drives the reducer too, includes it.
#pragma once

#include <memory>

#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/join.h"
#include "runtime/distributed/reducer.h"

namespace ddp {

class BucketGradientGate;
class BucketOptimizerShard;

struct DistributedDataParallel::Impl {
  ~Impl();
  const JoinOptions* join = nullptr;  // while join() runs
  std::unique_ptr<CommHook> hook;
  std::unique_ptr<BucketGradientGate> gate;  // overlap_optimizer
  std::unique_ptr<Reducer> reducer;
  std::shared_ptr<BucketOptimizerShard> shard;  // also held by the store while DistributedDataParallel lives
};

}  // namespace ddp
