// clip_grad_norm: one sum-of-squares pass over the flat gradient buffer when every gradient is current (the
// padding between slots is zero, so it adds nothing), else one per current slot; sharded, one per part of those
// in this rank's spans, and a sum over the ranks; then one scale pass.
#include "runtime/optim/clip_grad.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/autograd/optimizer_shard.h"
#include "runtime/core/check.h"
#include "runtime/kernels/dispatch.h"

namespace ddp {
namespace {

std::vector<FlatSpan> current_gradients(const ParameterStore& store) {
  bool all_current = true;
  for (const ParameterSlot& slot : store.slots()) all_current = all_current && slot.param.grad_valid();
  if (all_current) return {{0, store.total_numel()}};
  std::vector<FlatSpan> spans;
  for (const ParameterSlot& slot : store.slots()) {
    if (slot.param.grad_valid()) spans.push_back({slot.offset, slot.numel});
  }
  return spans;
}

// The current gradients this rank holds: all of them, or (sharded) those in its own spans.
std::vector<FlatSpan> held_gradients(const ParameterStore& store) {
  std::vector<FlatSpan> current = current_gradients(store);
  const OptimizerShard* shard = store.optimizer_shard();
  if (shard == nullptr) return current;
  std::vector<FlatSpan> held;
  for (const FlatSpan& s : current) {
    for (const FlatSpan& piece : intersect(shard->owned(), s)) held.push_back(piece);
  }
  return held;
}

}  // namespace

double clip_grad_norm(ParameterStore& store, double max_norm, const Stream& stream) {
  DDP_CHECK(max_norm > 0.0 && std::isfinite(max_norm),
            "clip_grad_norm: max_norm must be a positive finite number, got " + std::to_string(max_norm));
  const std::vector<FlatSpan> spans = held_gradients(store);
  OptimizerShard* shard = store.optimizer_shard();
  if (spans.empty() && shard == nullptr) return 0.0;
  store.wait_for_gradients(stream);  // the norm reads every gradient: all of them final first
  float* grads = store.flat_grads().data<float>();

  double sum = 0.0;
  if (!spans.empty()) {
    // One double per span on the store's device (8-byte int64 storage: tensors have no float64 type).
    Tensor partial = Tensor::empty({static_cast<std::int64_t>(spans.size())}, DType::kInt64, store.device(), stream);
    double* out = reinterpret_cast<double*>(partial.data<std::int64_t>());
    for (std::size_t k = 0; k < spans.size(); ++k) {
      DDP_DISPATCH(store.device(), sum_squares, grads + spans[k].offset, spans[k].count, out + k, stream.handle());
    }
    const std::vector<std::int64_t> bits = partial.to_vector<std::int64_t>(stream);  // waits for the stream
    for (std::int64_t b : bits) {
      double v;
      std::memcpy(&v, &b, sizeof v);
      sum += v;  // in slot order: the same bits on every run and every rank
    }
  }
  // Every rank takes part, whether or not it holds a current gradient.
  if (shard != nullptr) sum = shard->sum(sum);
  const double norm = std::sqrt(sum);
  if (!std::isfinite(norm)) return norm;

  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const FlatSpan& s : spans) {
      DDP_DISPATCH(store.device(), scale, grads + s.offset, s.count, static_cast<float>(coefficient),
                   stream.handle());
    }
  }
  return norm;
}

}  // namespace ddp
