// Before the first step, every rank must hold the same model: the same parameters, in the same order, with
// the same shapes and dtypes. Otherwise the bucket plans differ and the ranks would hang in mismatched
// collectives. The check broadcasts rank 0's list and ends every rank with one message naming the first
// differing parameter and the ranks that differ.
#pragma once

#include <vector>

#include "runtime/distributed/bucket_plan.h"
#include "runtime/distributed/world.h"

namespace ddp {

// Collective over `world`. Throws CollectiveError on every rank when any rank's list differs from rank 0's.
void verify_parameters_match(const World& world, const std::vector<ParameterSpec>& parameters);

}  // namespace ddp
