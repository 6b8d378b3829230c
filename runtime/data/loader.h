// BatchLoader: gathers the rank's next batch on a prefetch thread while the current one trains.
//
// The loader owns a small ring of host buffers (two by default: a double buffer) whose memory comes from the
// caller's allocator, so the training job can hand it pinned memory and copy a batch to the GPU asynchronously.
// One prefetch thread fills free buffers in sampler order; the consumer takes them in the same order. Nothing
// grows: the thread waits while every buffer is in use. An exception on the prefetch thread reaches the consumer
// from next(), after the batches finished before it. Destruction (or stop) wakes and joins the thread.
//
// Buffer lifetime: by default a batch stays valid until the next call to next(). A consumer that copies a batch
// asynchronously sets manual_release and calls release(batch) once the copy has completed (its event fired);
// meanwhile next() can already hand out the following batch from the other buffer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/data/idx.h"
#include "runtime/data/sampler.h"
#include "runtime/tensor/tensor.h"

namespace ddp {
namespace data {

// Where batch buffers come from; allocate must return memory aligned for float, or throw.
struct HostAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* pointer, size_t bytes)> deallocate;
};
// Ordinary (pageable) memory, 64-byte aligned.
HostAllocator default_host_allocator();

struct Batch {
  float* features = nullptr;  // [size, feature_count], in the caller's allocator's memory
  int32_t* labels = nullptr;  // [size] (classification)
  float* targets = nullptr;   // [size, target_width] (regression: a data set with targets)
  int64_t target_width = 0;
  int64_t size = 0;
  int64_t feature_count = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch: this rank's position before it / batch_size
  // Sampler positions once this batch is consumed: save global_position_after in a checkpoint taken after
  // training on this batch (sampler.h explains the resume rule).
  int64_t local_position_after = 0;
  int64_t global_position_after = 0;
  const std::vector<int64_t>* sample_indices = nullptr;  // the data set rows gathered, in order
};

// A batch as tensors on a device, what a training step consumes.
struct DeviceBatch {
  Tensor features;  // [size, feature_count] float32
  Tensor labels;    // [size] int32, or the targets [size, target_width] float32 of a regression
};

// Copies `batch` to `device` on `stream` (asynchronously through pinned staging on a GPU): the batch's buffers
// may be reused, and the loader's next() called, as soon as this returns.
//
//   while (const ddp::data::Batch* batch = loader.next()) {
//     auto [x, y] = ddp::data::to_device(*batch, session.device(), session.stream());
DeviceBatch to_device(const Batch& batch, const Device& device, const Stream& stream = current_stream());

struct LoaderOptions {
  int64_t batch_size = 0;
  bool drop_last_batch = false;  // skip a short final batch
  int buffers = 2;               // at least 2
  bool manual_release = false;   // see the top of this file
  HostAllocator allocator = default_host_allocator();
  // Runs on the prefetch thread after each gather (a conversion, an augmentation); may throw.
  std::function<void(Batch&)> on_filled;
};

class BatchLoader {
 public:
  // `data` must outlive the loader. Throws InvalidArgument when the batch size is not positive, is larger than
  // this rank's shard, or the sampler's data set size differs from data.size.
  BatchLoader(DatasetView data, DistributedSampler sampler, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Stops any epoch in flight, then starts prefetching `epoch` from a global sample position (0: the start;
  // a checkpoint's saved position to resume).
  void start_epoch(int64_t epoch, int64_t global_position = 0);
  // The next batch of the epoch, waiting for the prefetch thread if needed; nullptr at the epoch's end.
  // Rethrows an exception raised while preparing it.
  const Batch* next();
  // Hands a batch's buffer back (manual_release only; harmless otherwise).
  void release(const Batch* batch);
  // Stops and joins the prefetch thread; next() then returns nullptr until start_epoch.
  void stop();

  // Per epoch, for this rank, from the epoch's start.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  enum class SlotState { kFree, kReady, kInUse };
  struct Slot {
    Batch batch;
    std::vector<int64_t> indices;
    SlotState state = SlotState::kFree;
  };

  void produce();
  void fill(Slot& slot);

  DatasetView data_;
  DistributedSampler sampler_;  // touched only by the prefetch thread while one runs
  LoaderOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t num_samples_ = 0;
  size_t feature_bytes_ = 0;
  size_t label_bytes_ = 0;

  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool finished_ = false;
  std::exception_ptr error_;
  int64_t produced_ = 0;
  int64_t consumed_ = 0;
  Slot* held_ = nullptr;  // the batch next() auto-releases (not in manual mode)
  int64_t epoch_ = 0;
  std::thread thread_;
};

}  // namespace data
}  // namespace ddp
