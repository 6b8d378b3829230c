// The singleton trap of programs that `srun` starts directly (without mpirun or ddprun): unless srun hands each
// task a process-management interface the MPI library speaks (PMIx for Open MPI: `srun --mpi=pmix`), every
// task starts MPI alone, as rank 0 of a world of 1, and trains by itself while SLURM_STEP_NUM_TASKS says there
// are more. Open MPI then fails with a message blaming its build; other MPIs train N copies silently. World
// checks before MPI starts (srun_start_problem) and once it has (singleton_problem), so the job is refused at
// once, with the srun setting to use, before any work. Pure: the environment comes in as a map.
#pragma once

#include <map>
#include <string>

namespace ddp {

// The variables the checks read, from this process's environment.
std::map<std::string, std::string> srun_environment();

// Before MPI_Init: a task of an srun step of several tasks (SLURM_STEP_ID, SLURM_STEP_NUM_TASKS > 1) that has
// no process-management interface its MPI can use: none at all (srun --mpi=none, slurm.conf's MpiDefault
// left at none), or with `open_mpi` only PMI-2 (srun --mpi=pmi2; Open MPI 4 is built for PMIx). Empty when
// the start is fine (also for tasks that mpirun started: OMPI_COMM_WORLD_RANK).
std::string srun_start_problem(const std::map<std::string, std::string>& env, bool open_mpi);

// After MPI_Init: a world of `world_size` 1 in an srun step of several tasks; empty when not.
std::string singleton_problem(int world_size, const std::map<std::string, std::string>& env);

}  // namespace ddp
