// ddprun inside a Slurm allocation, from the variables Slurm sets (the batch script's environment as measured
// with Slurm 22.05: SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, SLURM_NTASKS, SLURM_GPUS_ON_NODE):
// host lists and task counts in Slurm's compressed forms, the job ddprun makes of them, and its refusals.
#include "launcher/slurm.h"

#include <gtest/gtest.h>

#include <sstream>

#include "launcher/command.h"
#include "launcher/shell_quote.h"
#include "runtime/core/check.h"
#include "tests/error_message.h"

namespace ddp {
namespace launcher {
namespace {

using Env = std::map<std::string, std::string>;

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

Env batch_script(const std::string& nodelist, const std::string& tasks_per_node, const std::string& ntasks) {
  return {{"SLURM_JOB_ID", "12"}, {"SLURM_JOB_NODELIST", nodelist}, {"SLURM_TASKS_PER_NODE", tasks_per_node},
          {"SLURM_NTASKS", ntasks}};
}

LaunchOptions program(int np = 0) {
  LaunchOptions o;
  o.np = np;
  o.program = {"/bin/train"};
  return o;
}

TEST(ExpandSlurmHostlist, RangesListsAndLeadingZeros) {
  EXPECT_EQ(joined(expand_slurm_hostlist("vm")), "vm");
  EXPECT_EQ(joined(expand_slurm_hostlist("n[01-03,7],login")), "n01 n02 n03 n7 login");
  EXPECT_EQ(joined(expand_slurm_hostlist("n[8-10]")), "n8 n9 n10");
  EXPECT_EQ(joined(expand_slurm_hostlist("n[098-101]")), "n098 n099 n100 n101");
  EXPECT_EQ(joined(expand_slurm_hostlist("r[1-2]n[1-2].ib")), "r1n1.ib r1n2.ib r2n1.ib r2n2.ib");
}

TEST(ExpandSlurmHostlist, MalformedListsSayWhatIsWrong) {
  for (const char* bad : {"n[1-3", "n1-3]", "n[a-b]", "n[3-1]", "a,,b", "n[]"}) {
    EXPECT_THROW(expand_slurm_hostlist(bad), InvalidArgument) << bad;
  }
  try {
    expand_slurm_hostlist("n[3-1]");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST 'n[3-1]': '3-1' is not a range"), std::string::npos)
        << e.what();
  }
}

TEST(ExpandSlurmTasksPerNode, RepeatsAndSingles) {
  EXPECT_EQ(joined(expand_slurm_tasks_per_node("2")), "2");
  EXPECT_EQ(joined(expand_slurm_tasks_per_node("2(x3),1")), "2 2 2 1");
  EXPECT_THROW(expand_slurm_tasks_per_node("2(x3"), InvalidArgument);
  EXPECT_THROW(expand_slurm_tasks_per_node("x"), InvalidArgument);
}

TEST(SlurmAllocation, NoneOutsideSlurmOrInsideAJobStep) {
  EXPECT_FALSE(slurm_allocation({}));
  Env step = batch_script("vm", "2", "2");
  step["SLURM_STEP_ID"] = "0";  // ddprun started by srun: the step's tasks are the ranks already
  EXPECT_FALSE(slurm_allocation(step));
}

TEST(SlurmAllocation, NodesTasksAndGpus) {
  Env env = batch_script("gpu[1-2]", "4(x2)", "8");
  env["SLURM_GPUS_ON_NODE"] = "4";
  const std::optional<SlurmAllocation> a = slurm_allocation(env);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->tasks, 8);
  EXPECT_EQ(a->gpus_per_node, 4);
  EXPECT_EQ(a->describe(), "job 12 (8 tasks on 2 nodes: gpu1:4,gpu2:4; 4 GPUs per node)");
  Env job_gpus = batch_script("vm", "2", "2");
  job_gpus["SLURM_JOB_GPUS"] = "0,1";
  EXPECT_EQ(slurm_allocation(job_gpus)->gpus_per_node, 2);
  EXPECT_EQ(slurm_allocation(batch_script("vm", "2", "2"))->gpus_per_node, -1);
}

TEST(SlurmAllocation, InconsistentVariablesAreRefusedNamingThem) {
  try {
    slurm_allocation(batch_script("n[1-2]", "2(x3)", "6"));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("names 2 nodes but SLURM_TASKS_PER_NODE '2(x3)' gives tasks for 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(slurm_allocation({{"SLURM_JOB_ID", "12"}}), InvalidArgument);
}

// An allocation of no task is refused: ddprun once announced "starting 0 ranks" and started 2.
TEST(SlurmAllocation, NoTaskIsRefusedNamingTheVariable) {
  std::string message;
  try {
    slurm_allocation(batch_script("vm", "2", "0"));
  } catch (const InvalidArgument& e) {
    message = e.what();
  }
  EXPECT_EQ(message.rfind("SLURM_NTASKS is 0: an allocation holds at least one task", 0), 0u) << message;
  EXPECT_THROW(slurm_allocation(batch_script("vm", "0", "")), InvalidArgument);
}

// A host list that names more nodes than the tasks are for is refused as soon as it does (within the test's
// bound of 5 s), however many it names: node[1-99999999] once took ddprun 7 GB and ten minutes.
TEST(SlurmAllocation, AHostListLongerThanTheTasksIsRefusedWithoutExpandingIt) {
  const std::string more = ::ddp::testing::error_message_within<InvalidArgument>(5, [] {
    slurm_allocation(batch_script("node[1-99999999]", "1", "1"));
  });
  EXPECT_EQ(more.rfind("SLURM_JOB_NODELIST 'node[1-99999999]' names more than 1 node(s), more than the allocation "
                       "has tasks for (SLURM_TASKS_PER_NODE)", 0), 0u) << more;
  const std::string tasks = ::ddp::testing::error_message_within<InvalidArgument>(5, [] {
    slurm_allocation(batch_script("node[1-99999999]", "1(x99999999)", "99999999"));
  });
  EXPECT_NE(tasks.find("SLURM_TASKS_PER_NODE '1(x99999999)' gives tasks for more than 1048576 nodes"),
            std::string::npos) << tasks;
  EXPECT_THROW(expand_slurm_hostlist("n[1-3]", 2), InvalidArgument);
  EXPECT_EQ(joined(expand_slurm_hostlist("n[1-3]", 3)), "n1 n2 n3");
}

TEST(PlanInAllocation, OneNodeIsALocalJobOfTheAllocationsTasks) {
  const SlurmAllocation a = *slurm_allocation(batch_script("vm", "2", "2"));
  const SlurmPlan plan = plan_in_allocation(program(), a, "vm.example.org");
  EXPECT_EQ(plan.refusal, "");
  EXPECT_EQ(plan.options.np, 2);
  EXPECT_EQ(plan.options.hosts, "");
  EXPECT_EQ(plan.announcement, "ddprun: in Slurm job 12 (2 tasks on 1 node: vm:2); starting 2 ranks on this node");
}

TEST(PlanInAllocation, SeveralNodesBecomeTheHostList) {
  const SlurmAllocation a = *slurm_allocation(batch_script("n[1-2]", "4(x2)", "8"));
  const SlurmPlan plan = plan_in_allocation(program(6), a, "n1");
  EXPECT_EQ(plan.refusal, "");
  EXPECT_EQ(plan.options.np, 6);
  EXPECT_EQ(plan.options.hosts, "n1:4,n2:4");
  EXPECT_NE(plan.announcement.find("starting 6 ranks over --hosts n1:4,n2:4 (-np)"), std::string::npos)
      << plan.announcement;
}

TEST(PlanInAllocation, MoreRanksThanTheAllocationHoldsAreRefusedWithItsSize) {
  const SlurmAllocation a = *slurm_allocation(batch_script("vm", "2", "2"));
  const SlurmPlan plan = plan_in_allocation(program(4), a, "vm");
  EXPECT_EQ(plan.refusal,
            "-np 4 is more ranks than Slurm job 12 (2 tasks on 1 node: vm:2) holds: pass -np 2 or fewer, or ask "
            "Slurm for more (sbatch --nodes=N --ntasks-per-node=T, one task per GPU)");
}

TEST(PlanInAllocation, GivenHostsAreKeptAndFewerTasksThanGpusAreNoted) {
  const SlurmAllocation a = *slurm_allocation(batch_script("vm", "2", "2"));
  LaunchOptions given = program();
  given.hosts = "a:1,b:1";
  EXPECT_EQ(plan_in_allocation(given, a, "vm").options.hosts, "a:1,b:1");
  Env env = batch_script("vm", "1", "1");
  env["SLURM_GPUS_ON_NODE"] = "4";
  const SlurmPlan plan = plan_in_allocation(program(), *slurm_allocation(env), "vm");
  EXPECT_NE(plan.note.find("--ntasks-per-node=4"), std::string::npos) << plan.note;
}

TEST(BuildMpirunCommand, InsideASlurmJobMpirunWaitsTheStopGraceBeforeEndingRanks) {
  MachineFacts facts;
  facts.cores = 2;
  LaunchOptions options = program(2);
  options.stop_grace_s = 40;
  const std::string outside = shell_join(build_mpirun_command(options, facts));
  EXPECT_EQ(outside.find("odls_base_sigkill_timeout"), std::string::npos) << outside;
  facts.env["SLURM_JOB_ID"] = "12";
  const std::string inside = shell_join(build_mpirun_command(options, facts));
  EXPECT_NE(inside.find("--mca odls_base_sigkill_timeout 20"), std::string::npos) << inside;
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
