// DistributedDataParallel::join and its per-step count (see join.h for the protocol).
//
// The count is a host all-reduce on the world's communicator (two doubles: ranks training, and of them ranks
// synchronising this step), at the start of every backward of a rank in its loop and in every round of a rank
// out of data. It needs no device synchronisation, and both kinds of rank then issue the same bucket
// all-reduces in the same order on the process group, so the two communicators never interleave differently.
#include <string>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/distributed_data_parallel_impl.h"
#include "runtime/distributed/world.h"

namespace ddp {
namespace {

CommBuffer whole(const Tensor& t) { return CommBuffer{t.data_ptr(), t.numel(), t.dtype(), t.device()}; }

}  // namespace

void DistributedDataParallel::join(const std::function<void()>& loop) { join(loop, JoinOptions{}); }

void DistributedDataParallel::join(const std::function<void()>& loop, const JoinOptions& options) {
  DDP_CHECK(impl_->join == nullptr, "DistributedDataParallel::join called inside join");
  DDP_CHECK(impl_->gate == nullptr,
            "DistributedDataParallel::join cannot run with DdpOptions::overlap_optimizer: turn the overlap off for a "
            "loop with uneven inputs");
  impl_->join = &options;
  struct Reset {
    DistributedDataParallel& ddp;
    ~Reset() {
      ddp.impl_->join = nullptr;
      ddp.impl_->reducer->set_contributors(ddp.group_.size());
    }
  } reset{*this};
  loop();
  // Out of data: answer every count the others make, and all-reduce zeros for each of their steps.
  bool first_round = true;
  bool sync = false;
  while (count_joined_step(/*training=*/false, &sync)) {
    first_round = false;
    if (!sync) continue;  // their no_sync backward: nothing to take part in
    backward_with_zero_gradients();
    if (options.joined_step) options.joined_step();
  }
  // Whoever found every rank out of data at its first round trained to the last step.
  broadcast_from_last_joiner(first_round);
}

bool DistributedDataParallel::count_joined_step(bool training, bool* sync) {
  double counts[2] = {training ? 1.0 : 0.0, training && *sync ? 1.0 : 0.0};
  world_.sum_in_place(counts, 2);
  const int ranks = world_.size();
  const int in_loop = static_cast<int>(counts[0]);
  const int syncing = static_cast<int>(counts[1]);
  if (in_loop == 0) return false;
  const long long step = impl_->reducer->steps() + 1;
  if (impl_->join->throw_on_early_termination && in_loop < ranks) {
    throw InputsExhausted("inputs exhausted: " + std::to_string(ranks - in_loop) + " of " + std::to_string(ranks) +
                              " ranks ran out of data before backward " + std::to_string(step) +
                              " (join with throw_on_early_termination): every rank stops here",
                          world_.rank());
  }
  if (syncing != 0 && syncing != in_loop) {
    throw CollectiveError("backward " + std::to_string(step) + " under join: " + std::to_string(syncing) + " of the " +
                              std::to_string(in_loop) + " ranks still training synchronise gradients and the " +
                              "others are under no_sync(); every rank must use no_sync() for the same steps",
                          world_.rank());
  }
  *sync = syncing != 0;
  impl_->reducer->set_contributors(impl_->join->divide_by_initial_world_size ? group_.size() : in_loop);
  return true;
}

void DistributedDataParallel::backward_with_zero_gradients() {
  autograd::zero_grad(parameters_.parameters());  // marks them stale; use_zero_gradient fills each with zeros
  impl_->reducer->prepare_for_backward();
  // Every gradient is final at once; the reducer launches the buckets in their order.
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    autograd::use_zero_gradient(parameters_.slot(i).param, compute_);
    impl_->reducer->mark_ready(i);
  }
  impl_->reducer->finalize();
}

void DistributedDataParallel::broadcast_from_last_joiner(bool last_joiner) {
  const int ranks = world_.size();
  const int root = ranks - static_cast<int>(world_.max(last_joiner ? ranks - world_.rank() : 0));
  if (ranks > 1) group_.broadcast(whole(parameters_.flat_params()), root, compute_)->wait(compute_);
}

}  // namespace ddp
