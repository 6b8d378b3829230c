// A bounded buffer of (input, target) samples that a running simulation feeds while training draws batches
// from it: the way an in-situ surrogate learns from states that arrive during training. Each training rank
// holds its own buffer (the shard of the samples sent to it), so memory is fixed per rank: capacity x
// (inputs + targets) floats, allocated once on the device that trains; when full, the oldest sample is
// overwritten. On a GPU the samples go from the application's device arrays into the buffer and from the
// buffer into a batch without passing through the host.
#pragma once

#include <cstdint>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/data/finite_samples.h"
#include "runtime/tensor/tensor.h"

namespace ddp::data {

class ReplayBuffer {
 public:
  // Room for `capacity` samples of `inputs` and `targets` float32 values on `device`. Throws InvalidArgument
  // for a capacity or a width below 1.
  ReplayBuffer(std::int64_t capacity, std::int64_t inputs, std::int64_t targets, const Device& device = Device::cpu(),
               const Stream& stream = current_stream());

  // Appends the rows of x [count, inputs] and y [count, targets], float32 on any device: typically the
  // application's own arrays seen through Tensor::from_blob. Copied in on `stream`: device to device on the
  // buffer's GPU, through pinned staging from host memory (which may then be reused at once). Device memory
  // of the caller's must stay unwritten until `stream` has done the copy. Throws InvalidArgument for other
  // shapes or types. The samples are checked first (finite_samples.h, under nonfinite(); on a GPU the check is
  // read back, synchronising `stream`): a sample refused leaves the buffer as it was; skipped ones are counted
  // in skipped(), not in added().
  void add(const Tensor& x, const Tensor& y, const Stream& stream = current_stream());
  // What add does with samples holding a NaN or an infinity: refuse them (the default) or skip them.
  void set_nonfinite(NonFinitePolicy policy) { nonfinite_ = policy; }
  NonFinitePolicy nonfinite() const { return nonfinite_; }
  // Fills x [batch, inputs] and y [batch, targets] (float32, on the buffer's device) with samples drawn
  // uniformly, with replacement, from those held; draw d of seed s is the same rows on every run and every
  // device. Queued on `stream`: one launch computes the rows and copies them (kernels' draw_samples). Throws
  // InvalidArgument when the buffer is empty or x and y do not fit it.
  void sample(std::uint64_t seed, std::uint64_t draw, const Tensor& x, const Tensor& y,
              const Stream& stream = current_stream()) const;

  std::int64_t size() const { return size_; }          // samples held, at most capacity()
  std::int64_t capacity() const { return capacity_; }
  std::int64_t added() const { return added_; }        // samples ever added
  std::int64_t skipped() const { return skipped_; }    // samples add skipped as not finite
  std::int64_t inputs() const { return inputs_; }
  std::int64_t targets() const { return targets_; }
  const Device& device() const { return device_; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(x_.nbytes() + y_.nbytes()); }

 private:
  // Checks that x and y are float32 [n, inputs] and [n, targets] (on the buffer's device when `here`); n.
  std::int64_t rows_of(const Tensor& x, const Tensor& y, bool here, const char* what) const;

  std::int64_t capacity_, inputs_, targets_;
  Device device_;
  std::int64_t size_ = 0, next_ = 0, added_ = 0, skipped_ = 0;
  NonFinitePolicy nonfinite_ = NonFinitePolicy::kRefuse;
  Tensor x_, y_;  // [capacity, inputs] and [capacity, targets]
};

}  // namespace ddp::data
