// srun's environment against what MPI needs to make one world of the step's tasks.
#include "runtime/distributed/srun_check.h"

#include <cstdlib>

namespace ddp {
namespace {

std::string get(const std::map<std::string, std::string>& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

// The step's tasks: SLURM_STEP_NUM_TASKS, else SLURM_NTASKS (srun sets both; older Slurms the second only).
int step_tasks(const std::map<std::string, std::string>& env) {
  std::string tasks = get(env, "SLURM_STEP_NUM_TASKS");
  if (tasks.empty()) tasks = get(env, "SLURM_NTASKS");
  return std::atoi(tasks.c_str());
}

std::string what_to_do() {
  return "start it with `srun --mpi=pmix ...` (Open MPI talks to Slurm through PMIx; `srun --mpi=list` shows "
         "what this Slurm offers), or set MpiDefault=pmix in slurm.conf, or start the job with ddprun inside the "
         "allocation (docs/slurm.md)";
}

}  // namespace

std::map<std::string, std::string> srun_environment() {
  std::map<std::string, std::string> env;
  for (const char* name : {"SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_MPI_TYPE",
                           "PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_RANK"}) {
    if (const char* value = std::getenv(name)) env[name] = value;
  }
  return env;
}

std::string srun_start_problem(const std::map<std::string, std::string>& env, bool open_mpi) {
  if (get(env, "SLURM_STEP_ID").empty() || !get(env, "OMPI_COMM_WORLD_RANK").empty()) return "";
  const int tasks = step_tasks(env);
  if (tasks <= 1 || !get(env, "PMIX_RANK").empty()) return "";
  const bool pmi2 = !get(env, "PMI_RANK").empty() || !get(env, "PMI_FD").empty();
  if (pmi2 && !open_mpi) return "";
  const std::string task = get(env, "SLURM_PROCID").empty() ? "?" : get(env, "SLURM_PROCID");
  const std::string how = pmi2 ? "srun gave it PMI-2 (--mpi=pmi2), which Open MPI was not built to use"
                               : "srun gave it no process-management interface (--mpi=none, or slurm.conf's "
                                 "MpiDefault=none)";
  return "this is task " + task + " of the " + std::to_string(tasks) + " tasks srun started (SLURM_STEP_NUM_TASKS), but " +
         how + ", so each task would start MPI alone, as rank 0 of 1, and train by itself: " + what_to_do();
}

std::string singleton_problem(int world_size, const std::map<std::string, std::string>& env) {
  if (world_size != 1 || get(env, "SLURM_STEP_ID").empty()) return "";
  const int tasks = step_tasks(env);
  if (tasks <= 1) return "";
  return "MPI started this task as a world of 1, but srun started " + std::to_string(tasks) +
         " tasks (SLURM_STEP_NUM_TASKS): the MPI library did not find srun's process-management interface " +
         (get(env, "SLURM_MPI_TYPE").empty() ? "" : "(srun --mpi=" + get(env, "SLURM_MPI_TYPE") + ") ") +
         "and each task would train alone; " + what_to_do();
}

}  // namespace ddp
