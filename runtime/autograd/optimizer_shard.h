// OptimizerShard: the part of a ParameterStore's update that this process owns, when several processes share
// the update of one set of parameters (ZeRO stage 1, DistributedDataParallel with DdpOptions::shard_optimizer).
//
// Why it lives by the store, below the optimizers and the distributed layer: the optimizer must learn which
// spans of the flat buffers to update and keep state for, and the distributed layer (which implements this
// interface) must learn when each span is updated, so that it can hand it to the other processes. Both already
// share the store, so the store carries it, as it carries the grad-ready hooks of backward; a user's code
// (`optimizer.step(stream)`) does not change.
//
// Contract: every process's owned spans are disjoint, in flat order, and together with the others' cover the
// flat buffers (padding included). Each process keeps optimizer state for its own spans only, packed in the
// order of owned(): span k's state starts at the sum of the counts of spans 0..k-1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/autograd/parameter_store.h"  // FlatSpan
#include "runtime/core/stream.h"

namespace ddp {

class OptimizerShard {
 public:
  virtual ~OptimizerShard() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The spans process `rank` updates, in flat order.
  virtual const std::vector<FlatSpan>& owned(int rank) const = 0;
  const std::vector<FlatSpan>& owned() const { return owned(rank()); }

  // The update of the parameters of owned()[k] is queued on `stream`: hand them to the other processes.
  // Called in order k = 0, 1, ... within one step.
  virtual void span_updated(std::size_t k, const Stream& stream) = 0;
  // After the last span_updated of a step: orders `stream` after every process's spans have arrived, so that
  // the whole flat parameter buffer holds the updated values.
  virtual void finish_update(const Stream& stream) = 0;

  // Host collectives, called by every process in the same order. The sum of `value` over the processes, added
  // in rank order (so every process gets the same bits): the gradient norm is a sum over the shards.
  virtual double sum(double value) = 0;
  // For checkpoints: on rank 0, `out` receives elements [range.offset, range.end()) of the whole flat buffer
  // whose owned part each process passes in `local` (host memory: its elements of `range`, in flat order).
  // `out` is ignored on the other ranks. One range at a time: no process ever holds more than the range.
  virtual void gather_to_first(FlatSpan range, const float* local, float* out) = 0;
};

// The parts of `range` that lie in `spans` (sorted, disjoint), in flat order.
std::vector<FlatSpan> intersect(const std::vector<FlatSpan>& spans, FlatSpan range);

}  // namespace ddp
