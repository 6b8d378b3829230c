// Uneven inputs: training loops whose ranks have different numbers of batches (PyTorch's DDP.join() and its
// Join context manager). Without it the ranks with more batches wait in their next all-reduce for a rank that
// has left its loop, until the watchdog ends the job.
//
//   ddp_model.join([&] {
//     for (const Batch& b : my_batches) {             // this rank's own number of batches
//       model.zero_grad(stream);
//       ddp_model.backward(loss_of(b));
//       optimizer.step(stream);
//     }
//   });
//
// While the loop runs, each backward first counts, with one small host all-reduce, the ranks still in their
// loop. A rank whose loop has returned keeps answering that count and, for every step the others still take,
// all-reduces zero gradients bucket by bucket in their place, so nothing hangs. When every loop has returned,
// the parameters of a rank that trained longest are broadcast, so every rank ends with the same parameters.
// The loop must issue no other collective of its own (a World::sum of the loss, say) while a rank may be out
// of data: only DistributedDataParallel's are taken part in.
#pragma once

#include <functional>
#include <string>

#include "runtime/distributed/job.h"  // CollectiveError

namespace ddp {

struct JoinOptions {
  // Each step's gradient is the sum over the ranks still training divided by the world size (true, PyTorch's
  // default: a rank out of data counts as a zero gradient, so later steps take smaller steps), or by the
  // number of ranks still training (false: their mean).
  bool divide_by_initial_world_size = true;
  // True: at the first step some rank is out of data, every rank raises InputsExhausted instead (backward()
  // on the ranks still training, join() on those out of data); no step is taken with fewer ranks.
  bool throw_on_early_termination = false;
  // Runs on a rank out of data after each step it took part in with zero gradients, with the step's averaged
  // gradients in the gradient buffer: the rest of the loop's step (the learning-rate schedule, the optimizer's
  // step). With it, the parameters and the optimizer state stay those of the ranks still training; without it
  // (as in PyTorch) the final broadcast gives the parameters, and the optimizer state stays behind.
  std::function<void()> joined_step;
};

// Raised on every rank alike under JoinOptions::throw_on_early_termination (reported once, by rank 0).
class InputsExhausted : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

}  // namespace ddp
