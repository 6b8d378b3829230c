// A bounded buffer of (input, target) samples that a running simulation feeds while training draws batches
// from it: the way an in-situ surrogate learns from states that arrive during training. Each training rank
// holds its own buffer (the shard of the samples sent to it), so memory is fixed per rank: capacity x
// (inputs + targets) floats, allocated once; when full, the oldest sample is overwritten.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::data {

class ReplayBuffer {
 public:
  // Throws InvalidArgument for a capacity or a width below 1.
  ReplayBuffer(std::int64_t capacity, std::int64_t inputs, std::int64_t targets);

  // Appends `count` samples: `x` holds count x inputs floats, `y` count x targets (row-major), copied in.
  void add(const float* x, const float* y, std::int64_t count);
  // Fills `x` (batch x inputs) and `y` (batch x targets) with samples drawn uniformly, with replacement, from
  // those held; draw d of seed s is the same on every run. Throws InvalidArgument when the buffer is empty.
  void sample(std::int64_t batch, std::uint64_t seed, std::uint64_t draw, float* x, float* y) const;

  std::int64_t size() const { return size_; }          // samples held, at most capacity()
  std::int64_t capacity() const { return capacity_; }
  std::int64_t added() const { return added_; }        // samples ever added
  std::int64_t inputs() const { return inputs_; }
  std::int64_t targets() const { return targets_; }
  std::int64_t bytes() const { return static_cast<std::int64_t>((x_.size() + y_.size()) * sizeof(float)); }

 private:
  std::int64_t capacity_, inputs_, targets_;
  std::int64_t size_ = 0, next_ = 0, added_ = 0;
  std::vector<float> x_, y_;
};

}  // namespace ddp::data
