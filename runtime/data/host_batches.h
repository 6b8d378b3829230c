// HostBatches: a data set that stays in the host's memory while a GPU trains on it, for one larger than the
// device's memory (or by choice). A BatchLoader's prefetch thread gathers the next batches into pinned buffers
// while the current step runs, and each step's batch is copied to the device asynchronously on the step's
// stream; a buffer goes back to the loader once its copy has completed. The batches are a DistributedSampler's,
// in its order, so a run gives the bits a ResidentDataset run gives. The copies are host-driven, so the steps
// that take these batches are not captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "runtime/data/batch_source.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"

namespace ddp {
namespace data {

class HostBatches final : public BatchSource {
 public:
  // `data` must outlive this object; batches of up to `batch_size` rows in `sampler_options`'s order, for
  // `device` (on the CPU: plain copies from the loader's buffers). `stream` orders the pinned buffers' frees.
  HostBatches(DatasetView data, const SamplerOptions& sampler_options, std::int64_t batch_size,
              const Device& device, const Stream& stream = current_stream());
  ~HostBatches() override;
  HostBatches(const HostBatches&) = delete;  // the loader's allocator refers to this object
  HostBatches& operator=(const HostBatches&) = delete;

  void start_epoch(const DistributedSampler& sampler, const Stream& stream) override;
  void gather_next(const Tensor& x, const Tensor& y, const Stream& stream) override;
  bool capturable() const override { return false; }
  Tensor empty_y(std::int64_t n, const Stream& stream) const override;

 private:
  // A batch whose copy to the device is in flight, and the event after it.
  struct InFlight {
    const Batch* batch;
    Event copied;
  };
  // Hands back the loader's buffers whose copies have completed, waiting for the oldest while more than
  // `at_most` remain.
  void release_copied(std::size_t at_most);
  // A tensor over the pinned storage the loader's buffer at `data` lies in.
  Tensor pinned_tensor(void* data, const Shape& shape, DType dtype) const;

  DatasetView data_;
  Device device_;
  std::map<void*, std::shared_ptr<Storage>> pinned_;  // the loader's buffers, by address (CUDA only)
  std::unique_ptr<BatchLoader> loader_;
  std::deque<InFlight> in_flight_;
};

}  // namespace data
}  // namespace ddp
