// The reliability tests' seam in the phases: a rank that stops making progress inside a given phase.
//
// DDP_FAULT_STALL=RANK:PHASE:STEP[:stop|:SECONDS] (runtime/core/settings.h): rank RANK (OMPI_COMM_WORLD_RANK)
// stops making progress the first time it enters PHASE (user, data, forward, backward, optimizer, checkpoint,
// evaluation; user code is entered when the outermost phase ends) at step STEP or later: it sleeps until the job
// is ended, or with ":stop" stops itself (SIGSTOP), as a rank that can no longer answer. With a number of SECONDS
// instead it pauses that long and goes on: the graceful stop's tests signal the job while a rank is inside PHASE.
// The hang report's tests inject their hangs with it. Unset, it costs one load of a static per phase entered.
// The trainer's own seam (a rank killed after a step) is runtime/training/fault_injection.h.
#pragma once

#include "runtime/core/phase.h"

namespace ddp {

// Called by PhaseGuard each time the training thread enters `phase`.
void maybe_inject_stall(Phase phase);

}  // namespace ddp
