// The reliability tests' seam in the trainer: a rank that dies, or fails alone, after a given step.
//
// DDP_FAULT_KILL_STEP=S and DDP_FAULT_KILL_RANK=R make rank R fail after optimizer step S, on the first attempt
// only (ddprun sets DDP_RESTART on restarts): killed by SIGKILL, or with DDP_FAULT_KIND=throw by an error of its
// own that the other ranks do not share. The time of the fault goes to DDP_FAULT_KILL_STAMP (a file) so that a
// test can measure how fast the job ends. Without DDP_FAULT_KILL_STEP it does nothing.
#pragma once

namespace ddp::training {

void maybe_inject_fault(long long step, int rank);

}  // namespace ddp::training
