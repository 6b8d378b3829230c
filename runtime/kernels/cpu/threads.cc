#include "runtime/kernels/cpu/threads.h"

#include <cblas.h>

#include <algorithm>

namespace ddp::kernels::cpu {

void set_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

}  // namespace ddp::kernels::cpu
