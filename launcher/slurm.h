// ddprun inside a Slurm allocation (sbatch, salloc): what the allocation holds, read from the SLURM_*
// variables Slurm sets for the batch script, and the job ddprun makes of it. Pure (the environment comes in as
// a map), so every case is unit-tested without a Slurm.
//
// Why ddprun reads the allocation itself: mpirun would too (Open MPI's ras/slurm), but ddprun decides the
// number of ranks and each rank's cores before mpirun starts, and must refuse a job the allocation cannot hold
// with the allocation's size in the message, not with mpirun's "not enough slots".
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/hosts.h"

namespace ddp {
namespace launcher {

// A Slurm job's allocation, as its batch script (or salloc's shell) sees it.
struct SlurmAllocation {
  std::string job_id;             // SLURM_JOB_ID
  std::vector<HostSlots> nodes;   // SLURM_JOB_NODELIST expanded, with SLURM_TASKS_PER_NODE's tasks as slots
  int tasks = 0;                  // the slots summed (SLURM_NTASKS when it was given)
  int gpus_per_node = -1;         // SLURM_GPUS_ON_NODE, else the count of SLURM_JOB_GPUS; -1: not said
  // "job 12 (8 tasks on 2 nodes: n1:4,n2:4; 4 GPUs per node)"
  std::string describe() const;
};

// The most nodes an allocation ddprun starts a job in may have (Slurm's largest systems have a few tens of
// thousands): variables that claim more are not an allocation's, and expanding them would not end.
constexpr size_t kMaxSlurmNodes = 1 << 20;

// Slurm's compressed host lists: "n[01-03,7],login" -> n01 n02 n03 n7 login (leading zeros kept, several
// bracket groups in one name allowed). Throws InvalidArgument on an unbalanced or malformed bracket, and as soon
// as the list names more than `max_hosts` nodes (before expanding the rest: "node[1-99999999]").
std::vector<std::string> expand_slurm_hostlist(const std::string& list, size_t max_hosts = kMaxSlurmNodes);
// SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1. Throws InvalidArgument when malformed or for more than
// kMaxSlurmNodes nodes.
std::vector<int> expand_slurm_tasks_per_node(const std::string& spec);

// The allocation ddprun runs in: empty outside Slurm (no SLURM_JOB_ID), and also inside a job step that srun
// started (SLURM_STEP_ID set: ddprun under srun would start a job per task; the step's tasks are its ranks
// already). Throws InvalidArgument naming the variable when Slurm's variables do not make sense together.
std::optional<SlurmAllocation> slurm_allocation(const std::map<std::string, std::string>& env);

// The job ddprun starts inside `allocation` for `options`: without --hosts/--hostfile, -np defaults to the
// allocation's tasks and the nodes become the host list (on one node, the local job it is); -np beyond the
// allocation is refused. --hosts/--hostfile given: kept as they are (the user chose).
struct SlurmPlan {
  LaunchOptions options;
  std::string announcement;  // "ddprun: in Slurm job 12: ...; starting 8 ranks"
  std::string note;          // non-empty: a remark worth printing (fewer tasks than GPUs per node)
  std::string refusal;       // non-empty: the job cannot start; the whole message
};
SlurmPlan plan_in_allocation(const LaunchOptions& options, const SlurmAllocation& allocation,
                             const std::string& this_host);

}  // namespace launcher
}  // namespace ddp
