// The singleton trap under srun, from the environments srun gives its tasks (as measured with Slurm 22.05 and
// Open MPI 4.1.4: --mpi=none sets no PMI variable, --mpi=pmi2 sets PMI_RANK and PMI_FD, --mpi=pmix PMIX_RANK).
#include "runtime/distributed/srun_check.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

using Env = std::map<std::string, std::string>;

Env srun_task(int procid, int tasks) {
  return {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", std::to_string(tasks)},
          {"SLURM_NTASKS", std::to_string(tasks)}, {"SLURM_PROCID", std::to_string(procid)}};
}

TEST(SrunStartProblem, TwoTasksWithoutPmiAreRefusedNamingTheSrunSetting) {
  const std::string problem = srun_start_problem(srun_task(1, 2), /*open_mpi=*/true);
  EXPECT_NE(problem.find("task 1 of the 2 tasks"), std::string::npos) << problem;
  EXPECT_NE(problem.find("rank 0 of 1"), std::string::npos) << problem;
  EXPECT_NE(problem.find("srun --mpi=pmix"), std::string::npos) << problem;
}

TEST(SrunStartProblem, Pmi2IsRefusedForOpenMpiOnly) {
  Env env = srun_task(0, 2);
  env["PMI_RANK"] = "0";
  env["PMI_FD"] = "7";
  const std::string problem = srun_start_problem(env, /*open_mpi=*/true);
  EXPECT_NE(problem.find("--mpi=pmi2"), std::string::npos) << problem;
  EXPECT_NE(problem.find("srun --mpi=pmix"), std::string::npos) << problem;
  EXPECT_EQ(srun_start_problem(env, /*open_mpi=*/false), "");
}

TEST(SrunStartProblem, PmixOrMpirunOrOneTaskOrNoSrunIsFine) {
  Env pmix = srun_task(0, 2);
  pmix["PMIX_RANK"] = "0";
  EXPECT_EQ(srun_start_problem(pmix, true), "");
  Env under_mpirun = srun_task(0, 2);  // ranks of an mpirun whose daemons srun started (several nodes)
  under_mpirun["OMPI_COMM_WORLD_RANK"] = "3";
  EXPECT_EQ(srun_start_problem(under_mpirun, true), "");
  EXPECT_EQ(srun_start_problem(srun_task(0, 1), true), "");
  Env batch_script = srun_task(0, 4);  // the batch script itself: SLURM_NTASKS but no step
  batch_script.erase("SLURM_STEP_ID");
  EXPECT_EQ(srun_start_problem(batch_script, true), "");
  EXPECT_EQ(srun_start_problem({}, true), "");
}

TEST(SingletonProblem, AWorldOfOneInAStepOfTwoIsRefused) {
  const std::string problem = singleton_problem(1, srun_task(0, 2));
  EXPECT_NE(problem.find("world of 1, but srun started 2 tasks"), std::string::npos) << problem;
  EXPECT_NE(problem.find("srun --mpi=pmix"), std::string::npos) << problem;
  EXPECT_EQ(singleton_problem(2, srun_task(0, 2)), "");
  EXPECT_EQ(singleton_problem(1, srun_task(0, 1)), "");
  EXPECT_EQ(singleton_problem(1, {}), "");
}

}  // namespace
}  // namespace ddp
