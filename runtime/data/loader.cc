// The prefetch ring: one producer thread, one consumer, a mutex and a condition variable.
#include "runtime/data/loader.h"

#include <cstring>
#include <new>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"

namespace ddp {
namespace data {
namespace {

// The batch's label or target buffer, whichever the data set has.
void* y_buffer(const Batch& b) {
  return b.targets != nullptr ? static_cast<void*>(b.targets) : static_cast<void*>(b.labels);
}

}  // namespace

DeviceBatch to_device(const Batch& batch, const Device& device, const Stream& stream) {
  Tensor x = Tensor::from_host(batch.features, {batch.size, batch.feature_count}, DType::kFloat32, device, stream);
  if (batch.target_width > 0) {
    return DeviceBatch{std::move(x), Tensor::from_host(batch.targets, {batch.size, batch.target_width},
                                                       DType::kFloat32, device, stream)};
  }
  return DeviceBatch{std::move(x), Tensor::from_host(batch.labels, {batch.size}, DType::kInt32, device, stream)};
}

HostAllocator default_host_allocator() {
  HostAllocator a;
  a.allocate = [](size_t bytes) { return ::operator new(bytes, std::align_val_t{64}); };
  a.deallocate = [](void* p, size_t) { ::operator delete(p, std::align_val_t{64}); };
  return a;
}

BatchLoader::BatchLoader(DatasetView data, DistributedSampler sampler, LoaderOptions options)
    : data_(data), sampler_(std::move(sampler)), options_(std::move(options)) {
  const SamplerOptions& so = sampler_.options();
  if (data_.size <= 0 || data_.feature_count <= 0 || data_.features == nullptr || data_.y_rows() == nullptr) {
    throw InvalidArgument("BatchLoader: the data set is empty");
  }
  if (so.dataset_size != data_.size) {
    throw InvalidArgument("BatchLoader: the sampler covers " + std::to_string(so.dataset_size) +
                          " samples but the data set has " + std::to_string(data_.size));
  }
  sampler_.check_batch_size(options_.batch_size);
  num_samples_ = sampler_.num_samples();
  if (options_.buffers < 2) {
    throw InvalidArgument("BatchLoader: at least 2 buffers are needed, got " + std::to_string(options_.buffers));
  }
  DDP_CHECK(options_.allocator.allocate && options_.allocator.deallocate,
            "BatchLoader: the allocator needs both allocate and deallocate");
  batches_per_epoch_ = sampler_.batches_per_epoch(options_.batch_size, options_.drop_last_batch);
  feature_bytes_ = static_cast<size_t>(options_.batch_size * data_.feature_count) * sizeof(float);
  label_bytes_ = static_cast<size_t>(options_.batch_size * data_.y_row_bytes());
  slots_.resize(static_cast<size_t>(options_.buffers));
  try {
    for (Slot& slot : slots_) {
      slot.batch.features = static_cast<float*>(options_.allocator.allocate(feature_bytes_));
      void* y = options_.allocator.allocate(label_bytes_);
      if (data_.regression()) {
        slot.batch.targets = static_cast<float*>(y);
      } else {
        slot.batch.labels = static_cast<int32_t*>(y);
      }
      DDP_CHECK(slot.batch.features && y, "BatchLoader: the allocator returned null");
      slot.batch.feature_count = data_.feature_count;
      slot.batch.target_width = data_.target_width;
      slot.indices.reserve(static_cast<size_t>(options_.batch_size));
    }
  } catch (...) {
    for (Slot& slot : slots_) {
      if (slot.batch.features) options_.allocator.deallocate(slot.batch.features, feature_bytes_);
      if (void* y = y_buffer(slot.batch)) options_.allocator.deallocate(y, label_bytes_);
    }
    throw;
  }
  finished_ = true;  // nothing to hand out before start_epoch
}

BatchLoader::~BatchLoader() {
  stop();
  for (Slot& slot : slots_) {
    options_.allocator.deallocate(slot.batch.features, feature_bytes_);
    options_.allocator.deallocate(y_buffer(slot.batch), label_bytes_);
  }
}

void BatchLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (Slot& slot : slots_) slot.state = SlotState::kFree;
  held_ = nullptr;
  finished_ = true;
  produced_ = consumed_ = 0;
}

void BatchLoader::start_epoch(int64_t epoch, int64_t global_position) {
  stop();
  // The sampler is the prefetch thread's once it starts; set it up (and let a bad position throw) here.
  sampler_.set_epoch(epoch);
  sampler_.set_global_position(global_position);
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = false;
  finished_ = false;
  error_ = nullptr;
  epoch_ = epoch;
  thread_ = std::thread([this] { produce(); });
}

void BatchLoader::fill(Slot& slot) {
  Batch& b = slot.batch;
  b.size = static_cast<int64_t>(slot.indices.size());
  b.epoch = epoch_;
  const size_t row_bytes = static_cast<size_t>(data_.feature_count) * sizeof(float);
  for (size_t k = 0; k < slot.indices.size(); ++k) {
    const int64_t i = slot.indices[k];
    DDP_CHECK(i >= 0 && i < data_.size, "BatchLoader: sample index " + std::to_string(i) + " out of range");
    std::memcpy(b.features + k * static_cast<size_t>(data_.feature_count),
                data_.features + static_cast<size_t>(i) * static_cast<size_t>(data_.feature_count), row_bytes);
    const size_t y_bytes = static_cast<size_t>(data_.y_row_bytes());
    std::memcpy(static_cast<char*>(y_buffer(b)) + k * y_bytes,
                static_cast<const char*>(data_.y_rows()) + static_cast<size_t>(i) * y_bytes, y_bytes);
  }
  b.sample_indices = &slot.indices;
}

void BatchLoader::produce() {
  try {
    for (int64_t n = 0;; ++n) {
      Slot& slot = slots_[static_cast<size_t>(n % static_cast<int64_t>(slots_.size()))];
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || slot.state == SlotState::kFree; });
        if (stopping_) return;
      }
      // The slot is free and only this thread writes free slots: gather without holding the lock.
      const int64_t index = sampler_.local_position() / options_.batch_size;
      if (!sampler_.next_batch(options_.batch_size, &slot.indices, options_.drop_last_batch)) break;
      fill(slot);
      slot.batch.index = index;
      slot.batch.local_position_after = sampler_.local_position();
      slot.batch.global_position_after = sampler_.global_position();
      if (options_.on_filled) options_.on_filled(slot.batch);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        slot.state = SlotState::kReady;
        ++produced_;
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  changed_.notify_all();
}

const Batch* BatchLoader::next() {
  PhaseGuard phase(Phase::kData);
  std::unique_lock<std::mutex> lock(mutex_);
  if (held_ != nullptr) {
    held_->state = SlotState::kFree;
    held_ = nullptr;
    changed_.notify_all();
  }
  Slot& slot = slots_[static_cast<size_t>(consumed_ % static_cast<int64_t>(slots_.size()))];
  changed_.wait(lock, [&] { return slot.state == SlotState::kReady || finished_; });
  if (slot.state != SlotState::kReady) {
    if (error_) {
      std::exception_ptr error = error_;
      error_ = nullptr;
      std::rethrow_exception(error);
    }
    return nullptr;
  }
  slot.state = SlotState::kInUse;
  ++consumed_;
  if (!options_.manual_release) held_ = &slot;
  return &slot.batch;
}

void BatchLoader::release(const Batch* batch) {
  if (batch == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& slot : slots_) {
      if (&slot.batch == batch && slot.state == SlotState::kInUse) {
        slot.state = SlotState::kFree;
        if (held_ == &slot) held_ = nullptr;
      }
    }
  }
  changed_.notify_all();
}

}  // namespace data
}  // namespace ddp
