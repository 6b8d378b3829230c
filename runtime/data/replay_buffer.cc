#include "runtime/data/replay_buffer.h"

#include <algorithm>
#include <string>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"
#include "runtime/kernels/counter_rng.h"
#include "runtime/kernels/dispatch.h"

namespace ddp::data {

ReplayBuffer::ReplayBuffer(std::int64_t capacity, std::int64_t inputs, std::int64_t targets, const Device& device,
                           const Stream& stream)
    : capacity_(capacity), inputs_(inputs), targets_(targets), device_(device) {
  DDP_CHECK(capacity >= 1 && inputs >= 1 && targets >= 1,
            "ReplayBuffer: capacity " + std::to_string(capacity) + ", inputs " + std::to_string(inputs) +
                " and targets " + std::to_string(targets) + " must each be at least 1");
  x_ = Tensor::empty({capacity, inputs}, DType::kFloat32, device, stream);
  y_ = Tensor::empty({capacity, targets}, DType::kFloat32, device, stream);
}

std::int64_t ReplayBuffer::rows_of(const Tensor& x, const Tensor& y, bool here, const char* what) const {
  const auto fits = [&](const Tensor& t, std::int64_t width) {
    return t.defined() && t.dtype() == DType::kFloat32 && t.dim() == 2 && t.size(1) == width &&
           (!here || t.device() == device_);
  };
  DDP_CHECK(fits(x, inputs_) && fits(y, targets_) && x.size(0) == y.size(0),
            std::string("ReplayBuffer::") + what + ": x and y must be float32 [n, " + std::to_string(inputs_) +
                "] and [n, " + std::to_string(targets_) + "]" + (here ? " on " + device_.str() : "") + ", got " +
                (x.defined() ? x.describe() : "undefined") + " and " + (y.defined() ? y.describe() : "undefined"));
  return x.size(0);
}

void ReplayBuffer::add(const Tensor& given_x, const Tensor& given_y, const Stream& stream) {
  PhaseGuard phase(Phase::kData);
  rows_of(given_x, given_y, /*here=*/false, "add");
  const FiniteSamples finite = finite_samples(given_x, given_y, nonfinite_, stream);
  skipped_ += finite.skipped;
  const Tensor& x = finite.x;
  const Tensor& y = finite.y;
  const std::int64_t count = x.size(0);
  // Only the newest `capacity` of a large batch would survive: skip the rest.
  const std::int64_t skip = std::max<std::int64_t>(0, count - capacity_);
  std::int64_t from = skip;
  while (from < count) {  // at most two pieces: up to the end of the ring, then from its start
    const std::int64_t n = std::min(count - from, capacity_ - next_);
    x_.slice_rows(next_, next_ + n).copy_from(x.slice_rows(from, from + n), stream);
    y_.slice_rows(next_, next_ + n).copy_from(y.slice_rows(from, from + n), stream);
    from += n;
    next_ = (next_ + n) % capacity_;
  }
  size_ = std::min(size_ + count - skip, capacity_);
  added_ += count;
}

void ReplayBuffer::sample(std::uint64_t seed, std::uint64_t draw, const Tensor& x, const Tensor& y,
                          const Stream& stream) const {
  PhaseGuard phase(Phase::kData);
  DDP_CHECK(size_ > 0, "ReplayBuffer::sample: the buffer is empty: add samples before drawing a batch");
  const std::int64_t batch = rows_of(x, y, /*here=*/true, "sample");
  const std::uint64_t key = counter_rng::splitmix64(seed ^ (draw * 0x100000001B3ULL));
  DDP_DISPATCH(device_, draw_samples, x_.data<float>(), y_.data<float>(), inputs_, targets_, size_, key, batch,
               x.data<float>(), y.data<float>(), stream.handle());
}

}  // namespace ddp::data
