#include "launcher/machine.h"

#include <unistd.h>

#include <fstream>

extern char** environ;

namespace ddp {
namespace launcher {
namespace {

// MemAvailable (what can be allocated without swapping out the page cache's working set), in bytes; 0 when
// /proc/meminfo cannot be read. Falls back to free physical pages on kernels without MemAvailable.
long long available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string name; meminfo >> name;) {
    long long kib = 0;
    if (name == "MemAvailable:" && meminfo >> kib) return kib * 1024;
    meminfo.ignore(1 << 20, '\n');
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<long long>(pages) * page : 0;
}

}  // namespace

MachineFacts current_machine() {
  MachineFacts facts;
  const HostFacts here = host_facts_here();
  facts.gpus = here.gpus();
  facts.cores = here.cores;
  facts.numa_cores = here.numa_cores;
  facts.gpu_numa = here.gpu_numa;
  facts.root = ::geteuid() == 0;
  facts.memory_available_bytes = available_memory_bytes();
#if defined(__x86_64__)
  facts.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) facts.env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return facts;
}

}  // namespace launcher
}  // namespace ddp
