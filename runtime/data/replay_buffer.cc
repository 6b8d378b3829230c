#include "runtime/data/replay_buffer.h"

#include <algorithm>
#include <string>

#include "runtime/core/check.h"

namespace ddp::data {
namespace {

// SplitMix64: a counter-based draw, so a batch depends on (seed, draw) alone.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

ReplayBuffer::ReplayBuffer(std::int64_t capacity, std::int64_t inputs, std::int64_t targets)
    : capacity_(capacity), inputs_(inputs), targets_(targets) {
  DDP_CHECK(capacity >= 1 && inputs >= 1 && targets >= 1,
            "ReplayBuffer: capacity " + std::to_string(capacity) + ", inputs " + std::to_string(inputs) +
                " and targets " + std::to_string(targets) + " must each be at least 1");
  x_.resize(static_cast<std::size_t>(capacity * inputs));
  y_.resize(static_cast<std::size_t>(capacity * targets));
}

void ReplayBuffer::add(const float* x, const float* y, std::int64_t count) {
  DDP_CHECK(count >= 0 && (count == 0 || (x != nullptr && y != nullptr)),
            "ReplayBuffer::add: " + std::to_string(count) + " samples from null arrays");
  // Only the newest `capacity` of a large batch would survive: skip the rest.
  const std::int64_t skip = std::max<std::int64_t>(0, count - capacity_);
  added_ += skip;
  for (std::int64_t i = skip; i < count; ++i) {
    std::copy(x + i * inputs_, x + (i + 1) * inputs_, x_.begin() + next_ * inputs_);
    std::copy(y + i * targets_, y + (i + 1) * targets_, y_.begin() + next_ * targets_);
    next_ = (next_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
    ++added_;
  }
}

void ReplayBuffer::sample(std::int64_t batch, std::uint64_t seed, std::uint64_t draw, float* x, float* y) const {
  DDP_CHECK(size_ > 0, "ReplayBuffer::sample: the buffer is empty: add samples before drawing a batch");
  DDP_CHECK(batch >= 0 && (batch == 0 || (x != nullptr && y != nullptr)),
            "ReplayBuffer::sample: a batch of " + std::to_string(batch) + " into null arrays");
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::int64_t j =
        static_cast<std::int64_t>(mix(mix(seed ^ (draw * 0x100000001B3ULL)) + static_cast<std::uint64_t>(i)) %
                                  static_cast<std::uint64_t>(size_));
    std::copy(x_.begin() + j * inputs_, x_.begin() + (j + 1) * inputs_, x + i * inputs_);
    std::copy(y_.begin() + j * targets_, y_.begin() + (j + 1) * targets_, y + i * targets_);
  }
}

}  // namespace ddp::data
