// Per-thread scratch buffers for the CPU kernels (bf16 widening, temporaries).
//
// Why: the contract asks for no allocation in steady state. Each thread keeps a few growable float buffers;
// after the first step of a fixed-shape training loop they are big enough and no call allocates again.
#pragma once

#include <cstddef>
#include <vector>

namespace ddp::kernels::cpu::detail {

// Slot `index` (0..7) of this thread's scratch, at least `n` floats. The pointer stays valid until the next
// call for the same slot on the same thread.
inline float* scratch_floats(int index, std::size_t n) {
  thread_local std::vector<float> slots[8];
  std::vector<float>& slot = slots[index];
  if (slot.size() < n) slot.resize(n);
  return slot.data();
}

}  // namespace ddp::kernels::cpu::detail
