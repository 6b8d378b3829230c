// Gradient-norm clipping over a ParameterStore: torch.nn.utils.clip_grad_norm_ (one L2 norm over every
// gradient together). Why it lives by the optimizers: it is the step between backward (after DDP's, every rank
// holds the same averaged gradients, so every rank computes the same norm and clips alike) and
// optimizer.step(), and the flat gradient buffer makes it two kernels — a sum of squares whose result is the
// same bits on every run, then a scale — whatever the number of parameters.
//
// Sharded (the store carries an OptimizerShard: DistributedDataParallel with shard_optimizer): each rank holds the
// averaged gradients of its own spans only, so each sums the squares of those and the norm is the square root
// of the sum over the ranks (OptimizerShard::sum, in rank order: every rank gets the same bits and clips alike);
// each rank scales its own spans. The partial sums are added in another grouping than the unsharded single
// pass, so the norm can differ from it in the last bits of a double.
#pragma once

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/stream.h"

namespace ddp {

// Returns the total L2 norm of the gradients before clipping; when it is above `max_norm`, scales every
// gradient by max_norm / (norm + 1e-6), as PyTorch. Gradients that are not current (zero_grad since the last
// backward wrote them) count as zero and are left alone. Reads the norm back to the host, so it waits for
// `stream`. A norm that is not finite (NaN or infinite gradients) is returned with the gradients untouched,
// so that the caller can skip the step (PyTorch would scale them by NaN).
double clip_grad_norm(ParameterStore& store, double max_norm, const Stream& stream = current_stream());

}  // namespace ddp
