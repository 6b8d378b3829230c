// ResidentDataset: a data set copied once into the memory of the device that trains on it, with batches gathered
// there by sample index.
//
// Why: a step's input is then one gather launch per tensor into buffers the caller allocated once, with no host
// copy of the batch, no allocation and no synchronisation, so a CUDA graph of the step can replay right behind
// it and the GPU never waits for the host. The order is a DistributedSampler's, uploaded once per epoch, so the
// batches are the samples, in the order, that BatchLoader gives: the CPU path and resumes do not change. Data
// sets larger than the device's memory stay in the host's (HostBatches) instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/data/batch_source.h"
#include "runtime/data/idx.h"
#include "runtime/tensor/tensor.h"

namespace ddp {
namespace data {

class ResidentDataset final : public BatchSource {
 public:
  // Copies `data` to `device` (in pieces, so the pinned staging stays small). `data` may go away afterwards.
  // With targets (data.target_width > 0), y is float32 [n, target_width] where it is int32 [n] for labels.
  ResidentDataset(DatasetView data, const Device& device, const Stream& stream = current_stream());

  // The epoch's order: row numbers of the data set (a sampler's indices()). Throws InvalidArgument naming the
  // first one out of range. Queued on `stream` after the gathers already queued there.
  void set_order(const std::vector<int64_t>& order, const Stream& stream);
  // set_order(sampler.indices()) and set_cursor(sampler.local_position()).
  void start_epoch(const DistributedSampler& sampler, const Stream& stream) override;
  int64_t order_size() const { return order_size_; }

  // Rows order[begin, begin + n) of the data set into x ([n, feature_count] float32) and y (labels: [n] int32;
  // targets: [n, target_width] float32), both on the device, n = x's rows; begin + n must not pass order_size(). Two launches on `stream`, nothing else.
  void gather(int64_t begin, const Tensor& x, const Tensor& y, const Stream& stream) const;

  // The same from a cursor kept in device memory, which then moves on by n: the batch's place is read on the
  // device, so a CUDA graph that captured gather_next gathers the next batch at every replay. set_order puts
  // the cursor at 0; set_cursor puts it elsewhere (a resume mid-epoch). The host follows the cursor too, at each
  // call or, for a captured gather, at each replay (on_each_replay), to refuse a batch that would pass the end of
  // the order before it is gathered. The order and the cursor stay at one address for the object's life (an
  // order of up to the data set's size; a longer one, with repeated rows, moves it), so a captured gather stays
  // valid across epochs of any length.
  void set_cursor(int64_t position, const Stream& stream);
  void gather_next(const Tensor& x, const Tensor& y, const Stream& stream) override;
  bool capturable() const override { return true; }
  int64_t cursor() const { return cursor_position_; }

  // The next step's batch gathered while this step's update runs, for a CUDA graph of the whole step. Called
  // once x and y are read for the last time (after backward), prefetch_next queues gather_next's batch on a
  // branch of its own, forked from `stream`; join_prefetch (after the update) joins it back into `stream`, so
  // the copy overlaps the optimizer instead of delaying the next forward. A batch that would pass the end of
  // the order is not gathered, on the device nor in the host's cursor: the epoch's last, shorter batch and the
  // next epoch's first are gathered by the steps that take them. take_prefetched(n) is true, once, when x and y
  // hold the next n rows from a prefetch (as of the replays and calls made so far); otherwise the step calls
  // gather_next itself. On the CPU the prefetch is a gather_next that stops at the end of the order.
  void prefetch_next(const Tensor& x, const Tensor& y, const Stream& stream) override;
  void join_prefetch(const Stream& stream) override;
  bool take_prefetched(int64_t n) override;

  int64_t size() const { return size_; }
  int64_t feature_count() const { return feature_count_; }
  int64_t target_width() const { return target_width_; }  // 0: labels
  // An empty y of n rows of this data set's kind (int32 labels, or float targets).
  Tensor empty_y(int64_t n, const Stream& stream) const override;
  const Device& device() const { return device_; }

 private:
  int64_t y_row_bytes() const { return target_width_ > 0 ? target_width_ * 4 : 4; }
  // The rows of a batch (x's), after checking x and y's types, shapes and device.
  int64_t check_batch(const Tensor& x, const Tensor& y) const;
  // The gather kernel from the device-side cursor, on `stream`.
  void enqueue_gather_next(int64_t n, const Tensor& x, const Tensor& y, StreamHandle stream) const;

  Device device_;
  int64_t size_ = 0;
  int64_t feature_count_ = 0;
  int64_t target_width_ = 0;
  Tensor features_;  // [size, feature_count] float32
  Tensor labels_;    // [size] int32, or the targets [size, target_width] float32
  Tensor order_;     // [capacity] int64: the epoch's order, order_size_ of them valid
  int64_t order_size_ = 0;
  Tensor cursor_;    // a kernels::GatherCursor on the device (3 int64): where gather_next reads, the order's end
  int64_t cursor_position_ = 0;  // the host's copy of the position
  int64_t prefetched_rows_ = 0;  // rows a prefetch put in x and y that no step has taken yet
  Stream prefetch_stream_;       // CUDA: the prefetch's branch, forked by one event and joined by the other
  Event prefetch_fork_, prefetch_done_;
};

}  // namespace data
}  // namespace ddp
