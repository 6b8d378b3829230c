// The facts of the node ddprun starts on that the mpirun command and the warnings depend on, gathered once at
// start; tests make them up, so that every decision built on them stays pure.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/hosts.h"

namespace ddp {
namespace launcher {

struct MachineFacts {
  int gpus = 0;   // CUDA devices on this node
  int cores = 1;  // physical cores this process may run on
  std::vector<int> numa_cores;  // of those, per NUMA node (HostFacts)
  std::vector<int> gpu_numa;    // NUMA node of each GPU (HostFacts)
  // The job's hosts (--hosts/--hostfile) as their probes described them, in the host list's order; empty when
  // they were not asked (--dry-run): each is then taken to be like this node.
  std::vector<HostFacts> hosts;
  bool root = false;
  long long memory_available_bytes = 0;  // MemAvailable of /proc/meminfo; 0: unknown
  bool avx2_fma = false;  // the CPU runs OpenBLAS's kOpenBlasCoreType kernel (x86-64 with AVX2 and FMA)
  std::map<std::string, std::string> env;
};
MachineFacts current_machine();

}  // namespace launcher
}  // namespace ddp
