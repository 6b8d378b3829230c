// HostBatches: the loader over pinned buffers, the asynchronous copies and the buffers' return.
#include "runtime/data/host_batches.h"

#include <cstring>
#include <string>
#include <utility>

#include "runtime/core/check.h"

namespace ddp {
namespace data {
namespace {

// Buffers in flight: one being copied, one ready, one being filled by the prefetch thread.
constexpr int kBuffers = 3;

}  // namespace

HostBatches::HostBatches(DatasetView data, const SamplerOptions& sampler_options, std::int64_t batch_size,
                         const Device& device, const Stream& stream)
    : data_(data), device_(device) {
  LoaderOptions options;
  options.batch_size = batch_size;
  options.buffers = kBuffers;
  options.manual_release = true;
  if (device.is_cuda()) {
    // Pinned buffers, so that a batch's copy to the device is truly asynchronous; kept by address so that a
    // batch can be copied as a tensor over its storage. The loader allocates them all in its constructor, below.
    options.allocator.allocate = [this, &stream](std::size_t bytes) {
      std::shared_ptr<Storage> storage = Storage::allocate_pinned(bytes, stream);
      void* p = storage->data();
      pinned_.emplace(p, std::move(storage));
      return p;
    };
    options.allocator.deallocate = [this](void* p, std::size_t) { pinned_.erase(p); };
  }
  loader_ = std::make_unique<BatchLoader>(data, DistributedSampler(sampler_options), options);
}

HostBatches::~HostBatches() {
  try {
    release_copied(0);
  } catch (...) {
    // A failed wait at teardown: the loader's buffers are freed after their streams' work anyway.
  }
  loader_.reset();
}

void HostBatches::start_epoch(const DistributedSampler& sampler, const Stream& /*stream*/) {
  release_copied(0);
  loader_->start_epoch(sampler.epoch(), sampler.global_position());
}

void HostBatches::gather_next(const Tensor& x, const Tensor& y, const Stream& stream) {
  release_copied(kBuffers - 2);
  const Batch* batch = loader_->next();
  const std::int64_t n = x.size(0);
  if (batch == nullptr || batch->size != n) {
    throw Error("HostBatches: the step wants " + std::to_string(n) + " rows but the epoch's next batch has " +
                    (batch == nullptr ? std::string("none (the epoch has ended)") : std::to_string(batch->size)),
                __FILE__, __LINE__);
  }
  void* y_rows = batch->target_width > 0 ? static_cast<void*>(batch->targets) : static_cast<void*>(batch->labels);
  if (device_.is_cpu()) {
    std::memcpy(x.data_ptr(), batch->features, static_cast<std::size_t>(x.nbytes()));
    std::memcpy(y.data_ptr(), y_rows, static_cast<std::size_t>(y.nbytes()));
    loader_->release(batch);
    return;
  }
  Tensor x_rows = x, y_rows_out = y;  // handles to the same memory (copy_from writes through them)
  x_rows.copy_from(pinned_tensor(batch->features, x.shape(), DType::kFloat32), stream);
  y_rows_out.copy_from(pinned_tensor(y_rows, y.shape(), y.dtype()), stream);
  InFlight copy{batch, Event::create(device_)};
  copy.copied.record(stream);
  in_flight_.push_back(std::move(copy));
}

Tensor HostBatches::empty_y(std::int64_t n, const Stream& stream) const {
  if (data_.regression()) return Tensor::empty({n, data_.target_width}, DType::kFloat32, device_, stream);
  return Tensor::empty({n}, DType::kInt32, device_, stream);
}

void HostBatches::release_copied(std::size_t at_most) {
  while (!in_flight_.empty() && (in_flight_.size() > at_most || in_flight_.front().copied.query())) {
    in_flight_.front().copied.synchronize();
    loader_->release(in_flight_.front().batch);
    in_flight_.pop_front();
  }
}

Tensor HostBatches::pinned_tensor(void* data, const Shape& shape, DType dtype) const {
  const auto it = pinned_.find(data);
  DDP_ASSERT(it != pinned_.end(), "HostBatches: a batch outside the loader's pinned buffers");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = it->second;
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace data
}  // namespace ddp
