// BatchSource: where a training loop's batches come from, one interface over the two places a data set can be
// held while it trains: the device's memory (ResidentDataset: a gather kernel per batch, capturable in a CUDA
// graph) and the host's (HostBatches: a prefetch thread fills pinned buffers, each batch copied to the device
// asynchronously), for a data set larger than the device. The loop that uses it (ddp::Trainer) picks one and
// runs the same steps over either, in a DistributedSampler's order, so both give the same batches bit for bit.
#pragma once

#include <cstdint>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/data/sampler.h"
#include "runtime/tensor/tensor.h"

namespace ddp {
namespace data {

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Begins the sampler's epoch from where the sampler stands (its epoch and position set by the caller).
  virtual void start_epoch(const DistributedSampler& sampler, const Stream& stream) = 0;
  // The epoch's next x.size(0) rows into x ([n, feature_count] float32) and y (int32 labels [n], or float32
  // targets [n, target_width]) on the device, enqueued on `stream`.
  virtual void gather_next(const Tensor& x, const Tensor& y, const Stream& stream) = 0;

  // Whether gather_next, prefetch_next and join_prefetch may be captured in a CUDA graph.
  virtual bool capturable() const = 0;
  // The next batch gathered beside the optimizer's update (see ResidentDataset); a source that cannot leaves
  // them empty and take_prefetched false, and each step then calls gather_next.
  virtual void prefetch_next(const Tensor& /*x*/, const Tensor& /*y*/, const Stream& /*stream*/) {}
  virtual void join_prefetch(const Stream& /*stream*/) {}
  virtual bool take_prefetched(std::int64_t /*n*/) { return false; }

  // An empty y of n rows of this data set's kind (int32 labels, or float targets), on the device.
  virtual Tensor empty_y(std::int64_t n, const Stream& stream) const = 0;
};

}  // namespace data
}  // namespace ddp
