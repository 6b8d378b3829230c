// ResidentDataset: the upload, the epoch's order and the gather (the gather_batch kernel on either device).
#include "runtime/data/resident_dataset.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/kernels/dispatch.h"
#include "runtime/core/check.h"
#include "runtime/core/graph.h"
#include "runtime/core/phase.h"

namespace ddp {
namespace data {
namespace {

// Host rows [begin, end) of `rows` (each `row_elements` of T) into the device tensor `dst`'s same rows.
template <typename T>
void upload_rows(const T* rows, int64_t row_elements, int64_t begin, int64_t end, DType dtype, const Tensor& dst,
                 const Stream& stream) {
  const int64_t n = end - begin;
  Tensor host = Tensor::empty({n, row_elements}, dtype, Device::cpu(), cpu_stream());
  std::memcpy(host.data_ptr(), rows + begin * row_elements, static_cast<std::size_t>(n * row_elements) * sizeof(T));
  Tensor target = dst.slice_rows(begin, end);
  target.copy_from(host.view(target.shape()), stream);
}

// Rows per piece of the upload: about 8 MiB of features.
int64_t rows_per_piece(int64_t feature_count) {
  return std::max<int64_t>(1, (int64_t{8} << 20) / std::max<int64_t>(1, feature_count * 4));
}

}  // namespace

ResidentDataset::ResidentDataset(DatasetView data, const Device& device, const Stream& stream)
    : device_(device), size_(data.size), feature_count_(data.feature_count), target_width_(data.target_width) {
  DDP_CHECK(data.size > 0 && data.feature_count > 0,
            "ResidentDataset: empty data set (" + std::to_string(data.size) + " rows of " +
                std::to_string(data.feature_count) + " features)");
  const Stream& s = device.is_cuda() ? stream : cpu_stream();
  features_ = Tensor::empty({size_, feature_count_}, DType::kFloat32, device, s);
  labels_ = empty_y(size_, s);
  // The epoch order's buffer, at its largest from the start: a CUDA graph that captured gather_next keeps
  // reading this address, so a later, longer epoch (after a resume mid-epoch) must not move it.
  order_ = Tensor::empty({size_}, DType::kInt64, device, s);
  static_assert(sizeof(kernels::GatherCursor) == 3 * sizeof(int64_t), "the cursor is three int64 words");
  cursor_ = Tensor::zeros({3}, DType::kInt64, device, s);  // position 0, end 0, no arrivals
  if (device.is_cuda()) {
    prefetch_stream_ = Stream::create(device);
    prefetch_fork_ = Event::create(device);
    prefetch_done_ = Event::create(device);
  }
  const int64_t piece = rows_per_piece(feature_count_);
  for (int64_t begin = 0; begin < size_; begin += piece) {
    const int64_t end = std::min(size_, begin + piece);
    upload_rows(data.features, feature_count_, begin, end, DType::kFloat32, features_, s);
    if (data.regression()) {
      upload_rows(data.targets, target_width_, begin, end, DType::kFloat32, labels_, s);
    } else {
      upload_rows(data.labels, 1, begin, end, DType::kInt32, labels_.view({size_, 1}), s);
    }
  }
}

Tensor ResidentDataset::empty_y(int64_t n, const Stream& stream) const {
  if (target_width_ > 0) return Tensor::empty({n, target_width_}, DType::kFloat32, device_, stream);
  return Tensor::empty({n}, DType::kInt32, device_, stream);
}

void ResidentDataset::start_epoch(const DistributedSampler& sampler, const Stream& stream) {
  set_order(sampler.indices(), stream);
  set_cursor(sampler.local_position(), stream);
}

void ResidentDataset::set_order(const std::vector<int64_t>& order, const Stream& stream) {
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (order[i] < 0 || order[i] >= size_) {
      throw InvalidArgument("ResidentDataset::set_order: position " + std::to_string(i) + " names row " +
                            std::to_string(order[i]) + " of a data set of " + std::to_string(size_) + " rows");
    }
  }
  const int64_t n = static_cast<int64_t>(order.size());
  const Stream& s = device_.is_cuda() ? stream : cpu_stream();
  // Longer than the data set (an order that repeats rows) only by a new buffer: a graph capturing gather_next
  // must then be captured again.
  if (order_.numel() < n) order_ = Tensor::empty({n}, DType::kInt64, device_, s);
  if (n > 0) {
    Tensor host = Tensor::empty({n}, DType::kInt64, Device::cpu(), cpu_stream());
    std::memcpy(host.data_ptr(), order.data(), static_cast<std::size_t>(n) * sizeof(int64_t));
    // Stream-ordered: gathers of the previous epoch, already queued, read the old order first.
    order_.flat_slice(0, {n}).copy_from(host, s);
  }
  order_size_ = n;
  cursor_.flat_slice(1, {1}).fill_(static_cast<double>(n), s);  // the end (exact: far below 2^53)
  set_cursor(0, stream);
}

void ResidentDataset::set_cursor(int64_t position, const Stream& stream) {
  DDP_CHECK(position >= 0 && position <= order_size_, "ResidentDataset::set_cursor: position " +
                                                          std::to_string(position) + " of an epoch order of " +
                                                          std::to_string(order_size_));
  const Stream& s = device_.is_cuda() ? stream : cpu_stream();
  cursor_.flat_slice(0, {1}).fill_(static_cast<double>(position), s);  // exact: positions are far below 2^53
  cursor_position_ = position;
  prefetched_rows_ = 0;  // a prefetched batch was from the old place
}

int64_t ResidentDataset::check_batch(const Tensor& x, const Tensor& y) const {
  const int64_t n = x.dim() == 2 ? x.size(0) : -1;
  DDP_CHECK(n >= 0 && x.size(1) == feature_count_ && x.dtype() == DType::kFloat32 && x.device() == device_,
            "ResidentDataset: the batch's x must be float32 [n, " + std::to_string(feature_count_) + "] on " +
                device_.str() + ", got " + x.describe());
  if (target_width_ > 0) {
    DDP_CHECK(y.numel() == n * target_width_ && y.dtype() == DType::kFloat32 && y.device() == device_,
              "ResidentDataset: the batch's y must be float32 [" + std::to_string(n) + ", " +
                  std::to_string(target_width_) + "] on " + device_.str() + ", got " + y.describe());
  } else {
    DDP_CHECK(y.numel() == n && y.dtype() == DType::kInt32 && y.device() == device_,
              "ResidentDataset: the batch's y must be int32 [" + std::to_string(n) + "] on " + device_.str() +
                  ", got " + y.describe());
  }
  return n;
}

void ResidentDataset::gather(int64_t begin, const Tensor& x, const Tensor& y, const Stream& stream) const {
  PhaseGuard phase(Phase::kData);
  const int64_t n = check_batch(x, y);
  DDP_CHECK(begin >= 0 && begin + n <= order_size_,
            "ResidentDataset::gather: rows [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                ") of an epoch order of " + std::to_string(order_size_));
  const int64_t* positions = order_.data<int64_t>() + begin;
  const auto s = device_.is_cuda() ? stream.handle() : nullptr;
  DDP_DISPATCH(device_, gather_batch, features_.data_ptr(), feature_count_ * 4, labels_.data_ptr(), y_row_bytes(), positions,
               nullptr, n, x.data_ptr(), y.data_ptr(), s);
}

void ResidentDataset::gather_next(const Tensor& x, const Tensor& y, const Stream& stream) {
  PhaseGuard phase(Phase::kData);
  const int64_t n = check_batch(x, y);
  // The host's copy of the cursor moves when the gather runs: now, or at each replay of a graph capturing it.
  auto advance = [this, n] {
    DDP_CHECK(cursor_position_ + n <= order_size_, "ResidentDataset::gather_next: rows [" +
                                                       std::to_string(cursor_position_) + ", " +
                                                       std::to_string(cursor_position_ + n) +
                                                       ") of an epoch order of " + std::to_string(order_size_));
    cursor_position_ += n;
  };
  now_or_on_each_replay(stream, advance);
  enqueue_gather_next(n, x, y, device_.is_cuda() ? stream.handle() : nullptr);
}

void ResidentDataset::prefetch_next(const Tensor& x, const Tensor& y, const Stream& stream) {
  PhaseGuard phase(Phase::kData);
  const int64_t n = check_batch(x, y);
  // The host follows the kernel's rule: the batch is gathered, and the cursor moves, only within the order.
  auto advance = [this, n] {
    prefetched_rows_ = cursor_position_ + n <= order_size_ ? n : 0;
    cursor_position_ += prefetched_rows_;
  };
  now_or_on_each_replay(stream, advance);
  if (!device_.is_cuda()) {
    enqueue_gather_next(n, x, y, nullptr);
    return;
  }
  prefetch_fork_.record(stream);
  prefetch_fork_.wait(prefetch_stream_);
  enqueue_gather_next(n, x, y, prefetch_stream_.handle());
  prefetch_done_.record(prefetch_stream_);
}

void ResidentDataset::join_prefetch(const Stream& stream) {
  if (device_.is_cuda()) prefetch_done_.wait(stream);
}

bool ResidentDataset::take_prefetched(int64_t n) {
  const bool ready = n > 0 && prefetched_rows_ == n;
  prefetched_rows_ = 0;
  return ready;
}

void ResidentDataset::enqueue_gather_next(int64_t n, const Tensor& x, const Tensor& y, StreamHandle stream) const {
  auto* cursor = static_cast<kernels::GatherCursor*>(cursor_.data_ptr());
  DDP_DISPATCH(device_, gather_batch, features_.data_ptr(), feature_count_ * 4, labels_.data_ptr(), y_row_bytes(),
               order_.data<int64_t>(), cursor, n, x.data_ptr(), y.data_ptr(), stream);
}

}  // namespace data
}  // namespace ddp
