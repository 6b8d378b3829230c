// GradientGate: a store's gradients that become final piece by piece on the device, and the waits that order a
// stream after a piece.
//
// Why: DistributedDataParallel all-reduces the gradients bucket by bucket while backward runs; the last bucket
// (the first layer's, the last gradient backward makes) cannot start before backward ends, and an optimizer
// that waits for every bucket updates nothing until then. With DdpOptions::overlap_optimizer the store carries
// this gate instead of a finished wait: the optimizer updates each piece as soon as its own all-reduce is done, so the
// updates of the earlier pieces run while the last one is still on the wire. Like OptimizerShard, it lives by the
// store, below both the optimizers (which split their update at its boundaries) and the distributed layer
// (which implements it); a user's `optimizer.step(stream)` does not change.
//
// Contract: the pieces are contiguous and in flat order, piece k covering elements [boundaries()[k],
// boundaries()[k + 1]) of the flat buffers. Whoever reads gradients other than through the optimizer's update
// (a gradient norm, user code) calls wait_all first (ParameterStore::wait_for_gradients).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/stream.h"

namespace ddp {

class GradientGate {
 public:
  virtual ~GradientGate() = default;
  // Piece k is [boundaries()[k], boundaries()[k + 1]); the first boundary is 0, the last the buffer's length.
  virtual const std::vector<std::int64_t>& boundaries() const = 0;
  // Orders `stream` after piece k's gradients are final; nothing when they are already (or no backward is
  // pending).
  virtual void wait_piece(std::size_t k, const Stream& stream) = 0;
  // Orders `stream` after every piece's gradients are final.
  virtual void wait_all(const Stream& stream) = 0;
};

}  // namespace ddp
