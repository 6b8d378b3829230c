// The hosts of a job: the probe line, the mapping that gives each rank its share of its host's cores (on its
// GPU's NUMA node where the hosts allow), the probe's mpirun command, and which hosts an (elastic) attempt keeps.
#include "launcher/hosts.h"

#include <gtest/gtest.h>

#include <fstream>

#include "launcher/attempt.h"
#include "launcher/command.h"
#include "launcher/shell_quote.h"
#include "runtime/core/check.h"
#include "tests/scratch.h"

namespace ddp {
namespace launcher {
namespace {

std::string joined(const std::vector<std::string>& v) { return shell_join(v); }

HostFacts host(int cores, std::vector<int> numa_cores = {}, std::vector<int> gpu_numa = {}) {
  HostFacts f;
  f.cores = cores;
  f.numa_cores = std::move(numa_cores);
  f.gpu_numa = std::move(gpu_numa);
  return f;
}

std::vector<PlacedHost> placed(const std::vector<std::pair<int, HostFacts>>& slots_and_facts) {
  std::vector<PlacedHost> hosts;
  for (const auto& [slots, facts] : slots_and_facts) {
    hosts.push_back(PlacedHost{HostSlots{"h" + std::to_string(hosts.size()), slots}, facts});
  }
  return hosts;
}

TEST(ProbeLine, RoundTrips) {
  const HostFacts f = host(64, {32, 32}, {0, 0, 0, 0, 1, 1, 1, 1});
  EXPECT_EQ(probe_line(f), "ddprun-probe: cores=64 numa_cores=32,32 gpu_numa=0,0,0,0,1,1,1,1");
  const auto back = parse_probe_line("[1,0]<stdout>:" + probe_line(f));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->cores, 64);
  EXPECT_EQ(back->numa_cores, f.numa_cores);
  EXPECT_EQ(back->gpu_numa, f.gpu_numa);
  const auto cpu_only = parse_probe_line("ddprun-probe: cores=2 numa_cores=- gpu_numa=-");
  ASSERT_TRUE(cpu_only);
  EXPECT_TRUE(cpu_only->numa_cores.empty());
  EXPECT_EQ(cpu_only->gpus(), 0);
  EXPECT_EQ(parse_probe_line("ddprun-probe: cores=2 numa_cores=1 gpu_numa=-1,0")->gpu_numa,
            (std::vector<int>{-1, 0}));
  for (const char* bad : {"", "cores=2", "ddprun-probe: cores=0 numa_cores=- gpu_numa=-",
                          "ddprun-probe: cores=2 numa_cores=x gpu_numa=-", "ddprun-probe: cores=2 numa_cores=1",
                          "ddprun-probe: cores=2 numa_cores=1 gpu_numa=- extra"}) {
    EXPECT_FALSE(parse_probe_line(bad)) << bad;
  }
}

TEST(HostFactsHere, DescribeThisMachine) {
  const HostFacts f = host_facts_here();
  EXPECT_GE(f.cores, 1);
  int in_nodes = 0;
  for (int c : f.numa_cores) in_nodes += c;
  if (!f.numa_cores.empty()) {
    EXPECT_EQ(in_nodes, f.cores);
  }
  EXPECT_EQ(parse_probe_line(probe_line(f))->cores, f.cores);
}

TEST(Binding, EachRankItsShareOfItsHost) {
  // The seed's 2 nodes x 4 GPUs x 32 cores: 8 cores a rank.
  EXPECT_EQ(joined(binding_arguments(8, placed({{4, host(32)}, {4, host(32)}}))),
            "--map-by slot:PE=8 --bind-to core");
  // Hosts that differ: the smallest share, so that every host can give it.
  EXPECT_EQ(joined(binding_arguments(8, placed({{4, host(32)}, {4, host(12)}}))),
            "--map-by slot:PE=3 --bind-to core");
  // Fewer ranks than slots fill the first host first: the second, smaller one takes none.
  EXPECT_EQ(joined(binding_arguments(4, placed({{4, host(32)}, {4, host(2)}}))), "--map-by slot:PE=8 --bind-to core");
  // One node, as before: cores / ranks.
  EXPECT_EQ(joined(binding_arguments(2, placed({{2, host(2)}}))), "--map-by slot:PE=1 --bind-to core");
}

TEST(Binding, MoreRanksThanCoresOrSlotsFloat) {
  const std::string unbound = "--oversubscribe --bind-to none --map-by slot";
  EXPECT_EQ(joined(binding_arguments(4, placed({{4, host(2)}}))), unbound);
  EXPECT_EQ(joined(binding_arguments(12, placed({{4, host(32)}, {4, host(32)}}))), unbound);
  EXPECT_EQ(joined(binding_arguments(8, placed({{4, host(32)}, {4, host(3)}}))), unbound);
}

TEST(Binding, OnTheGpusNumaNodeWhereTheHostsSayIt) {
  // 8 GPUs, 4 on each of 2 NUMA nodes of 56 cores: rank j on 14 cores of GPU j's node.
  const HostFacts dgx = host(112, {56, 56}, {0, 0, 0, 0, 1, 1, 1, 1});
  EXPECT_EQ(joined(binding_arguments(16, placed({{8, dgx}, {8, dgx}}))), "--map-by ppr:4:numa:PE=14 --bind-to core");
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, dgx}}))), "--map-by ppr:4:numa:PE=14 --bind-to core");
  // Where GPU order does not follow NUMA order, or the layout is unknown, uneven, or the ranks are not one per
  // GPU, each rank gets its share of the host instead.
  const std::string per_host = "--map-by slot:PE=14 --bind-to core";
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, host(112, {56, 56}, {0, 1, 0, 1, 0, 1, 0, 1})}}))), per_host);
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, host(112, {56, 56}, {-1, -1, -1, -1, -1, -1, -1, -1})}}))),
            per_host);
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, host(112, {}, {0, 0, 0, 0, 1, 1, 1, 1})}}))), per_host);
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, host(112, {56, 56}, {0, 0, 0, 0, 0, 0, 1, 1})}}))), per_host);
  EXPECT_EQ(joined(binding_arguments(8, placed({{8, host(112, {56, 56, 0}, {0, 0, 0, 0, 1, 1, 1, 1})}}))), per_host);
  EXPECT_EQ(joined(binding_arguments(4, placed({{4, dgx}}))), "--map-by slot:PE=28 --bind-to core");
  // Hosts whose layouts differ: no common ppr.
  const HostFacts four = host(64, {32, 32}, {0, 0, 1, 1});
  EXPECT_EQ(joined(binding_arguments(12, placed({{8, dgx}, {4, four}}))), "--map-by slot:PE=14 --bind-to core");
}

TEST(Probe, CommandStartsDdprunOnceOnTheHostUnbound) {
  MachineFacts facts;
  facts.root = true;
  EXPECT_EQ(joined(build_probe_command("node7", facts, "/opt/ddprun")),
            "mpirun -np 1 --allow-run-as-root --host node7 --bind-to none /opt/ddprun --ddprun-probe");
  // Probes run side by side: each mpirun keeps its session directory apart.
  EXPECT_EQ(joined(build_probe_command("node7", facts, "/opt/ddprun", "/tmp/ddprun-probe.ab12cd")),
            "mpirun -np 1 --allow-run-as-root --mca orte_local_tmpdir_base /tmp/ddprun-probe.ab12cd --host node7 "
            "--bind-to none /opt/ddprun --ddprun-probe");
}

LaunchOptions over(const std::string& hosts, int np = 0, int min_np = 0) {
  LaunchOptions o;
  o.hosts = hosts;
  o.np = np;
  o.min_np = min_np;
  o.program = {"/bin/train"};
  return o;
}

HostAnswer answered(int cores) { return HostAnswer{true, host(cores), ""}; }
HostAnswer silent(const std::string& why) { return HostAnswer{false, HostFacts{}, why}; }

TEST(Attempt, AllHostsAnswer) {
  const AttemptPlan plan = plan_attempt(over("a:2,b:2"), MachineFacts{}, {answered(8), answered(4)});
  EXPECT_TRUE(plan.refusal.empty());
  EXPECT_TRUE(plan.lost.empty());
  EXPECT_EQ(plan.options.hosts, "a:2,b:2");
  EXPECT_EQ(plan.options.np, 0);  // as given: all slots
  ASSERT_EQ(plan.facts.size(), 2u);
  EXPECT_EQ(plan.facts[1].cores, 4);
}

TEST(Attempt, ALostHostEndsTheJobWithoutMinNp) {
  const AttemptPlan plan =
      plan_attempt(over("a:2,b:2"), MachineFacts{}, {answered(8), silent("ssh: connect to host b port 22: No route")});
  EXPECT_EQ(plan.refusal,
            "cannot reach b (ssh: connect to host b port 22: No route); pass --min-np N to go on with the hosts that "
            "answer when N ranks fit");
}

TEST(Attempt, GoesOnWithTheHostsThatAnswerDownToMinNp) {
  AttemptPlan plan =
      plan_attempt(over("a:2,b:2,c:2", 0, 2), MachineFacts{}, {silent("refused"), answered(8), answered(8)});
  EXPECT_TRUE(plan.refusal.empty());
  EXPECT_EQ(plan.options.hosts, "b:2,c:2");
  EXPECT_EQ(plan.options.np, 4);
  EXPECT_EQ(plan.lost, (std::vector<std::string>{"a (refused)"}));
  // An explicit -np below the slots left stays.
  plan = plan_attempt(over("a:4,b:4", 3, 1), MachineFacts{}, {answered(8), silent("refused")});
  EXPECT_EQ(plan.options.np, 3);
  EXPECT_EQ(plan.options.hosts, "a:4");
  // Too few left.
  plan = plan_attempt(over("a:2,b:2", 0, 3), MachineFacts{}, {answered(8), silent("refused")});
  EXPECT_EQ(plan.refusal, "cannot reach b (refused), and the hosts that answer have slots for 2 ranks, fewer than "
                          "--min-np 3");
  plan = plan_attempt(over("a:2,b:2", 0, 1), MachineFacts{}, {silent("x"), silent("y")});
  EXPECT_NE(plan.refusal.find("slots for 0 ranks"), std::string::npos) << plan.refusal;
}

TEST(Attempt, AHostFileBecomesTheHostsThatAnswer) {
  const std::string path = ddp::testing::scratch_path("attempt_hosts.txt");

  std::ofstream(path) << "n1 slots=4\nn2 slots=4\n";
  LaunchOptions o;
  o.hostfile = path;
  o.min_np = 4;
  o.program = {"/bin/train"};
  const AttemptPlan plan = plan_attempt(o, MachineFacts{}, {silent("down"), answered(16)});
  EXPECT_TRUE(plan.refusal.empty()) << plan.refusal;
  EXPECT_EQ(plan.options.hosts, "n2:4");
  EXPECT_TRUE(plan.options.hostfile.empty());
  EXPECT_EQ(plan.options.np, 4);
  EXPECT_THROW(plan_attempt(o, MachineFacts{}, {answered(1)}), Error);
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
