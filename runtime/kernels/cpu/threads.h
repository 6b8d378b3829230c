// The CPU kernels' thread count: OpenBLAS's threads per process. Several ranks on one node each get a share of
// its cores (oversubscribed BLAS threads slow every rank down), so the runtime sets it once per rank.
#pragma once

namespace ddp::kernels::cpu {

// Sets the BLAS threads of this process (at least 1).
void set_threads(int threads);

}  // namespace ddp::kernels::cpu
