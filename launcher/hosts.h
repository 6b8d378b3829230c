// The hosts a job runs on and how its ranks are bound to their cores: what a host has (cores, NUMA nodes, the
// NUMA node of each GPU), as this node reads it from sysfs and as another host reports it to a probe, and the
// mpirun mapping that gives each rank its share of its host's cores, on its GPU's NUMA node where that can be
// said. Pure except for host_facts_here().
//
// Why a probe: ddprun runs on one node, and the others' cores and GPUs are not visible from there. Before a
// job over --hosts/--hostfile, ddprun starts itself once on each host through mpirun (so through whatever
// mpirun uses to reach it: ssh, Slurm's srun) as "ddprun --ddprun-probe", which prints one probe_line(). A host
// that does not answer is unreachable, which is also how an elastic restart learns that a host was lost.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "h1:4,h2:4" (":N" optional, default 1 slot); throws InvalidArgument on a malformed entry.
std::vector<HostSlots> parse_hosts(const std::string& spec);
// The hosts of an Open MPI host file ("host [slots=N] ..." lines, '#' comments; 1 slot when not given), and
// their total slots. Throw InvalidArgument naming the file when it cannot be read or holds no host.
std::vector<HostSlots> parse_hostfile(const std::string& path);
int hostfile_slots(const std::string& path);

struct HostFacts {
  int cores = 1;                // physical cores this process may run on
  std::vector<int> numa_cores;  // of those, per NUMA node (index = node number); empty: unknown
  std::vector<int> gpu_numa;    // NUMA node of each CUDA device, in CUDA's order; -1: unknown
  int gpus() const { return static_cast<int>(gpu_numa.size()); }
};

// This node, as this process sees it (its CPU affinity: a Slurm allocation's cpuset, say).
HostFacts host_facts_here();

// "ddprun-probe: cores=16 numa_cores=8,8 gpu_numa=0,0,1,1" (empty lists print as "-").
std::string probe_line(const HostFacts& facts);
// The facts in a probe line, tagged by mpirun or not; empty for any other line.
std::optional<HostFacts> parse_probe_line(const std::string& raw_line);
constexpr const char* kProbeFlag = "--ddprun-probe";

// A host of the job: where it is, how many ranks go there, and what it has.
struct PlacedHost {
  HostSlots slots;
  HostFacts facts;
};

// mpirun's mapping and binding options for `np` ranks placed on `hosts` in order (mpirun fills each host's
// slots before the next):
//   - more ranks than a host can give a core each: no binding ("--oversubscribe --bind-to none --map-by slot");
//   - each host's GPUs sorted by NUMA node, the same number k of them on every NUMA node that has cores, one
//     rank per GPU: "--map-by ppr:k:numa:PE=q --bind-to core", so local rank j (on GPU j, World's binding)
//     runs on q cores of GPU j's NUMA node, q the cores of the smallest NUMA node / k;
//   - otherwise each rank its share of its host: "--map-by slot:PE=p --bind-to core", p the smallest
//     cores / ranks over the hosts.
std::vector<std::string> binding_arguments(int np, const std::vector<PlacedHost>& hosts);

}  // namespace launcher
}  // namespace ddp
