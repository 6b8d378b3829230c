// ddprun's pure parts: command construction for each kind of machine and option, parsing and its errors,
// output-tag rewriting, and attributing a failure to the rank that failed first.
#include "launcher/command.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "launcher/cli.h"
#include "launcher/failure_tracker.h"
#include "launcher/relay.h"
#include "launcher/resources.h"
#include "launcher/shell_quote.h"
#include "runtime/core/check.h"
#include "tests/scratch.h"

namespace ddp {
namespace launcher {
namespace {

MachineFacts machine(int gpus, int cores, bool root, std::map<std::string, std::string> env = {}) {
  MachineFacts f;
  f.gpus = gpus;
  f.cores = cores;
  f.root = root;
  f.env = std::move(env);
  return f;
}

LaunchOptions program(int np = 0) {
  LaunchOptions o;
  o.np = np;
  o.program = {"/bin/train", "--epochs", "1"};
  return o;
}

std::string joined(const std::vector<std::string>& v) { return shell_join(v); }

bool contains(const std::vector<std::string>& v, const std::vector<std::string>& run) {
  return std::search(v.begin(), v.end(), run.begin(), run.end()) != v.end();
}

TEST(Command, OneNodeWithGpusNonRoot) {
  const auto cmd = build_mpirun_command(program(), machine(4, 16, false));
  EXPECT_EQ(joined(cmd),
            "mpirun -np 4 --map-by slot:PE=4 --bind-to core --tag-output --mca pml ob1 -x NCCL_NVLS_ENABLE=0 /bin/train "
            "--epochs 1");
}

TEST(Command, RootAddsAllowRunAsRoot) {
  const auto cmd = build_mpirun_command(program(2), machine(0, 2, true));
  EXPECT_EQ(joined(cmd), "mpirun -np 2 --allow-run-as-root --map-by slot:PE=1 --bind-to core --tag-output "
                         "--mca pml ob1 -x NCCL_NVLS_ENABLE=0 /bin/train --epochs 1");
}

TEST(Command, OneNodeTakesSharedMemoryUnlessTheUserChose) {
  EXPECT_TRUE(contains(build_mpirun_command(program(2), machine(0, 4, false)), {"--mca", "pml", "ob1"}));
  MachineFacts own = machine(0, 4, false);
  own.env["OMPI_MCA_pml"] = "ucx";
  EXPECT_FALSE(contains(build_mpirun_command(program(2), own), {"--mca"}));
  LaunchOptions two_hosts = program(8);
  two_hosts.hosts = "n1:4,n2:4";
  EXPECT_FALSE(contains(build_mpirun_command(two_hosts, machine(0, 4, false)), {"--mca"}));
}

TEST(Command, DefaultNpIsGpusOrTwo) {
  EXPECT_EQ(resolve_np(program(), machine(8, 64, false)), 8);
  EXPECT_EQ(resolve_np(program(), machine(0, 64, false)), 2);
  EXPECT_EQ(resolve_np(program(3), machine(8, 64, false)), 3);
}

TEST(Command, MoreRanksThanCoresOversubscribes) {
  const auto cmd = build_mpirun_command(program(4), machine(0, 2, false));
  EXPECT_TRUE(contains(cmd, {"--oversubscribe", "--bind-to", "none"})) << joined(cmd);
  EXPECT_FALSE(contains(cmd, {"--bind-to", "core"}));
}

TEST(Command, ForwardsDdpAndNcclVariables) {
  const auto cmd = build_mpirun_command(
      program(2), machine(0, 4, false, {{"DDP_COLLECTIVE_TIMEOUT_S", "30"}, {"NCCL_DEBUG", "WARN"}, {"HOME", "/root"},
                                        {"NCCL_NVLS_ENABLE", "1"}, {"XDDP_NOT", "1"}}));
  EXPECT_TRUE(contains(cmd, {"-x", "DDP_COLLECTIVE_TIMEOUT_S"}));
  EXPECT_TRUE(contains(cmd, {"-x", "NCCL_DEBUG"}));
  EXPECT_TRUE(contains(cmd, {"-x", "NCCL_NVLS_ENABLE"}));  // the user's own value, not overridden
  EXPECT_FALSE(contains(cmd, {"-x", "NCCL_NVLS_ENABLE=0"}));
  EXPECT_FALSE(contains(cmd, {"-x", "HOME"}));
  EXPECT_FALSE(contains(cmd, {"-x", "XDDP_NOT"}));
}

TEST(Command, PinsOpenBlasKernelWhereTheCpuRunsItAndTheUserChoseNone) {
  MachineFacts avx2 = machine(0, 4, false);
  avx2.avx2_fma = true;
  EXPECT_TRUE(contains(build_mpirun_command(program(2), avx2),
                       {"-x", std::string("OPENBLAS_CORETYPE=") + kOpenBlasCoreType}));
  avx2.env["OPENBLAS_CORETYPE"] = "SkylakeX";
  const auto own = build_mpirun_command(program(2), avx2);
  EXPECT_TRUE(contains(own, {"-x", "OPENBLAS_CORETYPE"})) << joined(own);  // the user's own value, forwarded
  EXPECT_FALSE(contains(own, {"-x", std::string("OPENBLAS_CORETYPE=") + kOpenBlasCoreType}));
  // A CPU without AVX2 cannot run that kernel: OpenBLAS keeps its own choice there.
  const auto older = build_mpirun_command(program(2), machine(0, 4, false));
  EXPECT_EQ(joined(older).find("OPENBLAS_CORETYPE"), std::string::npos) << joined(older);
}

TEST(Command, BackendAndRestartEnvironment) {
  LaunchOptions o = program(2);
  o.backend = "mpi";
  const auto cmd = build_mpirun_command(o, machine(0, 4, false, {{"DDP_BACKEND", "nccl"}, {"DDP_RESUME", "0"}}),
                                        {{"DDP_RESTART", "1"}, {"DDP_RESUME", "1"}});
  EXPECT_TRUE(contains(cmd, {"-x", "DDP_BACKEND=mpi"}));
  EXPECT_FALSE(contains(cmd, {"-x", "DDP_BACKEND"}));  // --backend wins over the environment
  EXPECT_TRUE(contains(cmd, {"-x", "DDP_RESTART=1"}));
  EXPECT_TRUE(contains(cmd, {"-x", "DDP_RESUME=1"}));
  EXPECT_FALSE(contains(cmd, {"-x", "DDP_RESUME"}));
}

TEST(Command, HostsAndHostfile) {
  LaunchOptions o = program();
  o.hosts = "node1:4,node2:4";
  // Not probed: each host is taken to be like this one, so each of its 4 ranks gets 32 / 4 cores.
  auto cmd = build_mpirun_command(o, machine(4, 32, false));
  EXPECT_TRUE(contains(cmd, {"mpirun", "-np", "8", "--host", "node1:4,node2:4", "--map-by", "slot:PE=8",
                             "--bind-to", "core"}))
      << joined(cmd);
  // Probed: the smaller host sets the share.
  MachineFacts probed = machine(4, 32, false);
  probed.hosts = {HostFacts{32, {}, {}}, HostFacts{16, {}, {}}};
  cmd = build_mpirun_command(o, probed);
  EXPECT_TRUE(contains(cmd, {"--map-by", "slot:PE=4", "--bind-to", "core"})) << joined(cmd);
  o.np = 12;
  cmd = build_mpirun_command(o, machine(4, 32, false));
  EXPECT_TRUE(contains(cmd, {"--oversubscribe"}));

  const std::string path = ddp::testing::scratch_path("hosts.txt");

  std::ofstream(path) << "# two nodes\nnode1 slots=2\nnode2 slots=3 max_slots=3\n\nnode3\n";
  EXPECT_EQ(hostfile_slots(path), 6);
  const std::vector<HostSlots> listed = parse_hostfile(path);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[1].host, "node2");
  EXPECT_EQ(listed[1].slots, 3);
  EXPECT_EQ(listed[2].slots, 1);
  LaunchOptions f = program();
  f.hostfile = path;
  cmd = build_mpirun_command(f, machine(0, 8, false));
  EXPECT_TRUE(contains(cmd, {"mpirun", "-np", "6", "--hostfile", path})) << joined(cmd);

  // A FIFO as the host file is refused before it is opened (opening it would block until a writer came).
  const std::string fifo = ddp::testing::scratch_path("hosts.fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    parse_hostfile(fifo);
    ADD_FAILURE() << "a FIFO was read as a host file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
  }

  EXPECT_EQ(parse_hosts("a,b:3").size(), 2u);
  EXPECT_EQ(parse_hosts("a,b:3")[1].slots, 3);
  EXPECT_THROW(parse_hosts("a:0"), InvalidArgument);
  EXPECT_THROW(parse_hosts(":4"), InvalidArgument);
  EXPECT_THROW(parse_hosts("a:x"), InvalidArgument);
  EXPECT_THROW(hostfile_slots("/nonexistent/hosts"), InvalidArgument);
  LaunchOptions both = program();
  both.hosts = "a";
  both.hostfile = path;
  EXPECT_THROW(build_mpirun_command(both, machine(0, 2, false)), InvalidArgument);
}

TEST(Command, RankWrapperGoesBeforeTheProgram) {
  const auto cmd = build_mpirun_command(program(2), machine(0, 2, false), {}, "/opt/ddprun");
  EXPECT_TRUE(contains(cmd, {"/opt/ddprun", kRankWrapperFlag, "--", "/bin/train", "--epochs", "1"}));
}

TEST(Command, ShellQuoting) {
  EXPECT_EQ(shell_quote("plain-word_1.txt"), "plain-word_1.txt");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
}

ParsedCommandLine parse(const std::vector<std::string>& args, std::string* err_text = nullptr) {
  std::ostringstream out, err;
  std::vector<std::string> argv = {"ddprun"};
  argv.insert(argv.end(), args.begin(), args.end());
  ParsedCommandLine p = parse_command_line(argv, out, err);
  if (err_text) *err_text = err.str() + out.str();
  return p;
}

TEST(CommandLine, ParsesFlagsAndProgram) {
  const auto p = parse({"-np", "4", "--backend", "nccl", "--max-restarts", "2", "--dry-run", "--", "prog", "--np",
                        "x", "--", "y"});
  ASSERT_TRUE(p.options);
  EXPECT_EQ(p.options->np, 4);
  EXPECT_EQ(p.options->backend, "nccl");
  EXPECT_EQ(p.options->max_restarts, 2);
  EXPECT_TRUE(p.options->dry_run);
  // Everything after the first -- belongs to the program, even its own -- and flags.
  EXPECT_EQ(p.options->program, (std::vector<std::string>{"prog", "--np", "x", "--", "y"}));
  EXPECT_EQ(parse({"-n", "3", "--", "p"}).options->np, 3);
  EXPECT_EQ(parse({"--np=5", "--", "p"}).options->np, 5);
  EXPECT_EQ(parse({"--min-np", "2", "--", "p"}).options->min_np, 2);
  EXPECT_EQ(parse({"--", "p"}).options->min_np, 0);
}

// A bad number is refused saying what is wanted, not with CLI11's 309-digit bound or "Could not convert".
TEST(CommandLine, BadNumbersOfSecondsOrRestartsSayWhatIsWanted) {
  for (const char* bad : {"0", "abc", "0.5", "-3", "86401", "99999999999999999999"}) {
    std::string err;
    const auto p = parse({"--stop-grace", bad, "--", "p"}, &err);
    EXPECT_FALSE(p.options) << bad;
    EXPECT_EQ(p.exit_code, 2) << bad;
    EXPECT_NE(err.find("'" + std::string(bad) + "' is not a whole number of seconds from 1 to 86400"),
              std::string::npos) << err;
    EXPECT_EQ(err.find("Could not convert"), std::string::npos) << err;
    EXPECT_EQ(err.find("1.79769"), std::string::npos) << err;
  }
  std::string err;
  EXPECT_FALSE(parse({"--max-restarts", "-1", "--", "p"}, &err).options);
  EXPECT_NE(err.find("'-1' is not a whole number of restarts from 0 to 1000"), std::string::npos) << err;
  EXPECT_EQ(parse({"--stop-grace", "60", "--", "p"}).options->stop_grace_s, 60);
}

TEST(CommandLine, HelpExitsZero) {
  std::string text;
  const auto p = parse({"--help"}, &text);
  EXPECT_FALSE(p.options);
  EXPECT_EQ(p.exit_code, 0);
  for (const char* flag : {"--np", "--hosts", "--hostfile", "--backend", "--max-restarts", "--min-np",
                           "--rank-memory-mib",
                           "--dry-run", "--stop-grace", "--dump [PID]", "PROGRAM", "128+S", "DDP_PROGRESS_BAR"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag;
  }
  // Once: one usage, no CLI11 type strings.
  EXPECT_EQ(text.find("Usage:"), text.rfind("Usage:")) << text;
  EXPECT_EQ(text.find("[OPTIONS]"), std::string::npos) << text;
  EXPECT_EQ(text.find("INT:"), std::string::npos) << text;
  EXPECT_NE(text.find("--stop-grace SECONDS (default 25)"), std::string::npos) << text;
}

TEST(CommandLine, DumpGoesAlone) {
  std::string text;
  const auto p = parse({"-np", "2", "--dump", "--", "prog"}, &text);
  EXPECT_FALSE(p.options);
  EXPECT_NE(p.exit_code, 0);
  EXPECT_NE(text.find("--dump goes alone"), std::string::npos) << text;
}

TEST(CommandLine, BadInputIsAClearError) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"-np", "0", "--", "p"}, "-np must be a positive number of ranks, got 0"},
      {{"-np", "-2", "--", "p"}, "-np must be a positive number of ranks"},
      {{"-np", "2"}, "missing the program to run"},
      {{"-np", "2", "--"}, "missing the program to run"},
      {{"-np", "2", "prog"}, "put the program and its arguments after --"},
      {{"--hosts", "a:1", "--hostfile", "f", "--", "p"}, "excludes"},
      {{"--hostfile", "/nonexistent/hostfile", "--", "p"}, "--hostfile /nonexistent/hostfile: cannot be read"},
      {{"--hosts", "a:zero", "--", "p"}, "slot count"},
      {{"--backend", "gloo", "--", "p"}, "gloo"},
      {{"--max-restarts", "-1", "--", "p"}, "max-restarts"},
      {{"--min-np", "0", "--", "p"}, "min-np"},
      {{"--bogus", "--", "p"}, "--bogus"},
  };
  for (const Case& c : cases) {
    std::string text;
    const auto p = parse(c.args, &text);
    EXPECT_FALSE(p.options) << c.message;
    EXPECT_NE(p.exit_code, 0) << c.message;
    EXPECT_NE(text.find(c.message), std::string::npos) << "expected '" << c.message << "' in: " << text;
    EXPECT_NE(text.find("--help"), std::string::npos) << text;
  }
}

TEST(Output, RewritesTags) {
  EXPECT_EQ(rewrite_tagged_line("[1,0]<stdout>:hello"), "[rank 0] hello");
  // The runtime's "rank R: " (for plain mpirun) is not said twice; another rank's number in the text stays.
  EXPECT_EQ(rewrite_tagged_line("[35713,12]<stderr>:rank 12: error: x"), "[rank 12] error: x");
  EXPECT_EQ(rewrite_tagged_line("[1,2]<stderr>:rank 1: error: x"), "[rank 2] rank 1: error: x");
  EXPECT_EQ(rewrite_tagged_line("[1,3]<stdout>:"), "[rank 3] ");
  EXPECT_EQ(rewrite_tagged_line("[1,3]<stdout>:[1,2]<stdout>:nested"), "[rank 3] [1,2]<stdout>:nested");
  for (const char* untouched : {"plain", "", "[x,1]<stdout>:a", "[1,]<stdout>:a", "[1,2]stdout:a",
                                "--------------------------------------------------------------------------"}) {
    EXPECT_EQ(rewrite_tagged_line(untouched), untouched);
  }
  const TaggedLine t = parse_tagged_line("[1,7]<stderr>:oops");
  EXPECT_TRUE(t.tagged);
  EXPECT_EQ(t.rank, 7);
  EXPECT_EQ(t.stream, "stderr");
  EXPECT_EQ(t.text, "oops");
}

TEST(Failure, MpirunReportsAreTheLastResort) {
  FailureTracker t;
  EXPECT_FALSE(t.first_failed_rank());
  for (const char* line : {"Primary job  terminated normally, but 1 process returned",
                           "mpirun detected that one or more processes exited with non-zero status, thus causing",
                           "  Process name: [[3346,1],1]", "  Exit code:    3"}) {
    t.observe(line, 0);
  }
  EXPECT_EQ(t.first_failed_rank(), 1);
  FailureTracker s;
  s.observe("mpirun noticed that process rank 5 with PID 0 on node vm exited on signal 9 (Killed).", 0);
  EXPECT_EQ(s.first_failed_rank(), 5);
  FailureTracker a;
  a.observe("MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD", 0);
  EXPECT_EQ(a.first_failed_rank(), 2);
}

std::string marker_line(int rank, int status, long long time_ns, bool stopped = false) {
  ExitMarker m;
  m.rank = rank;
  m.status = status;
  m.time_ns = time_ns;
  m.stopped = stopped;
  return "[1," + std::to_string(rank) + "]<stderr>:" + exit_marker(m);
}

constexpr long long kSecond = 1000000000LL;

TEST(Failure, ALostDaemonNamesItsHost) {
  FailureTracker t;
  t.observe("ORTE has lost communication with a remote daemon.", 1);
  EXPECT_EQ(t.lost_host(), "");
  t.observe("  HNP daemon   : [[24857,0],0] on node vm", 2);
  t.observe("  Remote daemon: [[24857,0],2] on node 127.0.0.3", 3);
  t.observe("  Remote daemon: [[24857,0],3] on node other", 4);
  EXPECT_EQ(t.lost_host(), "127.0.0.3");
  t.observe("[1,0]<stderr>:  Remote daemon: [[1,0],2] on node a-rank-said-it", 5);
  EXPECT_EQ(t.lost_host(), "127.0.0.3");
}

TEST(Failure, SshClosingTheConnectionNamesTheHost) {
  FailureTracker t;
  t.observe("[1,1]<stderr>:Connection to rank-text closed by remote host.", 1);
  EXPECT_EQ(t.lost_host(), "");
  t.observe("Connection to 127.0.0.3 closed by remote host.", 2);
  EXPECT_EQ(t.lost_host(), "127.0.0.3");
}

TEST(Failure, ErrorReportsOutrankMpirun) {
  FailureTracker t;
  t.observe("[1,0]<stdout>:step 10 loss 0.5 (rank 0 is fine)", 1);
  EXPECT_FALSE(t.first_failed_rank());
  t.observe("[1,3]<stderr>:rank 3: fatal: NCCL watchdog: allreduce bucket 2 timed out", 2);
  t.observe("[1,1]<stderr>:rank 1: error: peer died", 3);
  // mpirun names the first process to exit, which is not the cause.
  t.observe("  Process name: [[99,1],1]", 4);
  EXPECT_EQ(t.first_failed_rank(), 3);
}

TEST(Failure, TheTagNamesTheReportingRankNotTheText) {
  // A program that has already finalized MPI cannot ask its rank and may print the wrong one.
  FailureTracker t;
  t.observe("[1,1]<stderr>:rank 0: error: cannot write t.json.rank1.json", 5);
  EXPECT_EQ(t.first_failed_rank(), 1);
  FailureTracker untagged;
  untagged.observe("rank 2: error: x", 5);
  EXPECT_EQ(untagged.first_failed_rank(), 2);
}

TEST(Failure, AnErrorAllRanksRaisedNamesTheRanksItLists) {
  // Seen in the field: rank 0 found the checkpoint directory unusable, every rank agreed and exited 1, and rank
  // 1 (idle, so first out) was named.
  FailureTracker t;
  t.observe(marker_line(1, 1, 10 * kSecond), 10 * kSecond + 1000);
  t.observe("[1,0]<stderr>:error: checkpoint write failed:", 10 * kSecond + 2000);
  t.observe("[1,0]<stderr>:  rank 0: checkpoint directory afile exists but is not a directory", 10 * kSecond + 3000);
  t.observe(marker_line(0, 1, 10 * kSecond + 5000), 10 * kSecond + 6000);
  t.observe("  Process name: [[19411,1],1]", 10 * kSecond + 7000);
  EXPECT_EQ(t.first_failed_rank(), 0);
  EXPECT_EQ(t.first_failure_how(), "exit status 1");

  FailureTracker several;
  several.observe("[1,0]<stderr>:error: cannot resume:", 1);
  several.observe("[1,2]<stdout>:unrelated", 2);
  several.observe("[1,0]<stderr>:  ranks 2,3: no such file", 3);
  EXPECT_EQ(several.first_failed_rank(), 2);
}

TEST(Failure, ACrashOutranksTheErrorsItCauses) {
  // rank_failure_test: rank 1 is SIGKILLed; rank 0 then reports a fatal error and calls MPI_Abort.
  FailureTracker t;
  t.observe("[1,0]<stderr>:rank 0: fatal: MPI_Allreduce failed; aborting the job", 20 * kSecond + 100);
  t.observe("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD", 20 * kSecond + 200);
  t.observe(marker_line(0, 1, 20 * kSecond + 150), 20 * kSecond + 300);
  t.observe(marker_line(1, 137, 20 * kSecond), 20 * kSecond + 400);  // relayed last, happened first
  EXPECT_EQ(t.first_failed_rank(), 1);
  EXPECT_EQ(t.first_failure_how(), "signal 9");
}

TEST(Failure, StoppedRanksNeverCount) {
  // Rank 0 raised an error and aborted; mpirun then stopped rank 1, whose marker comes first.
  FailureTracker t;
  t.observe(marker_line(1, 143, 1 * kSecond, /*stopped=*/true), 1 * kSecond + 10);
  t.observe("[1,0]<stderr>:rank 0: error: disk full", 1 * kSecond + 20);
  t.observe(marker_line(0, 143, 1 * kSecond + 5, /*stopped=*/true), 1 * kSecond + 30);
  EXPECT_EQ(t.first_failed_rank(), 0);
  EXPECT_EQ(t.first_failure_how(), "");  // rank 0 itself was stopped before its own exit
  FailureTracker only_stopped;
  only_stopped.observe(marker_line(1, 143, 1, true), 2);
  EXPECT_FALSE(only_stopped.first_failed_rank());
}

TEST(Failure, ARankStoppedAsAskedCountsOnceHoweverOftenItsMarkerIsSeen) {
  // Relayed by mpirun and read again from the exit directory (job.h), or only from there.
  FailureTracker t;
  t.observe(marker_line(0, 75, 1 * kSecond, /*stopped=*/true), 1 * kSecond + 10);
  t.observe(marker_line(0, 75, 1 * kSecond, /*stopped=*/true), 2 * kSecond);
  t.observe(marker_line(1, 75, 1 * kSecond + 3, /*stopped=*/true), 2 * kSecond);
  EXPECT_EQ(t.ranks_stopped_as_asked(), 2);
  EXPECT_FALSE(t.first_failed_rank());
}

TEST(Failure, AnExitWellBeforeAnyReportWins) {
  // Rank 0 exits 3 without a word; 5 s later rank 1's watchdog gives up on it.
  FailureTracker t;
  t.observe(marker_line(0, 3, 100 * kSecond), 100 * kSecond + 1000);
  t.observe("[1,1]<stderr>:rank 1: fatal: did not complete within 5 s; aborting the job", 105 * kSecond);
  EXPECT_EQ(t.first_failed_rank(), 0);
  EXPECT_EQ(t.first_failure_how(), "exit status 3");
  // Within kRelaySlackNs the report wins: the exit may be the consequence of an error still on its way.
  FailureTracker close;
  close.observe(marker_line(1, 1, 100 * kSecond), 100 * kSecond + 10);
  close.observe("[1,0]<stderr>:rank 0: error: x", 100 * kSecond + kRelaySlackNs / 2);
  EXPECT_EQ(close.first_failed_rank(), 0);
}

TEST(Failure, EarliestExitMarkerWins) {
  FailureTracker t;
  t.observe("  Process name: [[99,1],0]", 0);
  t.observe(marker_line(2, 143, 2000), 1);
  t.observe(marker_line(1, 137, 1000), 2);
  t.observe(marker_line(0, 0, 500), 3);  // status 0 is no failure
  EXPECT_EQ(t.first_failed_rank(), 1);
  EXPECT_EQ(t.first_failure_how(), "signal 9");
  ExitMarker m;
  m.rank = 4;
  m.status = 3;
  m.time_ns = 123456789012345LL;
  m.stopped = true;
  const std::optional<ExitMarker> parsed = parse_exit_marker(exit_marker(m));
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->rank, 4);
  EXPECT_EQ(parsed->status, 3);
  EXPECT_EQ(parsed->time_ns, 123456789012345LL);
  EXPECT_TRUE(parsed->stopped);
  EXPECT_FALSE(parse_exit_marker("ddprun-exit: rank=x"));
  EXPECT_FALSE(parse_exit_marker("ddprun-exit: rank=1 status=3 time_ns=5 stopped=0 trailing"));
  EXPECT_FALSE(parse_exit_marker("ddprun-exit: rank=1 status=3 time_ns=5 stopped=2"));
}

MachineFacts with_memory(int cores, double gib) {
  MachineFacts f = machine(0, cores, false);
  f.memory_available_bytes = static_cast<long long>(gib * 1024 * 1024 * 1024);
  return f;
}

bool mentions(const std::vector<std::string>& warnings, const std::string& text) {
  return std::any_of(warnings.begin(), warnings.end(),
                     [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

TEST(Failure, ARankAskedToStopIsAStopNotAFailure) {
  ExitMarker m;
  m.rank = 1;
  m.status = 143;
  m.time_ns = 1000;
  m.asked_to_stop = true;
  const std::optional<ExitMarker> parsed = parse_exit_marker(exit_marker(m));
  ASSERT_TRUE(parsed);
  EXPECT_TRUE(parsed->asked_to_stop);
  EXPECT_FALSE(parsed->stopped);
  FailureTracker t;
  t.observe("[1,1]<stderr>:" + exit_marker(m), 1);
  EXPECT_EQ(t.ranks_asked_to_stop(), 1);
  EXPECT_FALSE(t.first_failed_rank());
}

// Everything a joiner gives back, fed `pieces` one after another and then ended.
std::vector<std::string> joined_lines(const std::vector<std::string>& pieces) {
  TaggedLineJoiner joiner;
  std::vector<std::string> lines;
  for (const std::string& p : pieces) {
    for (std::string& line : joiner.feed(p)) lines.push_back(line);
  }
  for (std::string& line : joiner.finish()) lines.push_back(line);
  return lines;
}

TEST(Output, ALineWrittenInPiecesByTwoRanksComesOutWholeUnderEachRanksTag) {
  const std::vector<std::string> expected = {"[1,1]<stdout>:part-one part-two", "[1,0]<stdout>:part-one part-two"};
  EXPECT_EQ(joined_lines({"[1,1]<stdout>:part-one [1,0]<stdout>:part-one [1,1]<stdout>:part-two\n"
                    "[1,0]<stdout>:part-two\n"}),
            expected);
  // The same bytes cut anywhere, a tag included, give the same lines.
  const std::string all =
      "[1,1]<stdout>:part-one [1,0]<stdout>:part-one [1,1]<stdout>:part-two\n[1,0]<stdout>:part-two\n";
  for (size_t cut = 1; cut < all.size(); ++cut) {
    EXPECT_EQ(joined_lines({all.substr(0, cut), all.substr(cut)}), expected) << "cut at " << cut;
  }
  EXPECT_EQ(rewrite_tagged_line(expected[0]), "[rank 1] part-one part-two");
}

TEST(Output, StreamsOfOneRankAndMpirunsOwnLinesStayApart) {
  EXPECT_EQ(joined_lines({"[1,0]<stdout>:out-a [1,0]<stderr>:err\nmpirun: a note\n[1,0]<stdout>:out-b\n"}),
            (std::vector<std::string>{"[1,0]<stderr>:err", "mpirun: a note", "[1,0]<stdout>:out-a out-b"}));
  // Brackets in a rank's text are text; an unfinished line comes out at the end.
  EXPECT_EQ(joined_lines({"[1,2]<stdout>:x[3] = [1,2]\n", "[1,2]<stdout>:no newline"}),
            (std::vector<std::string>{"[1,2]<stdout>:x[3] = [1,2]", "[1,2]<stdout>:no newline"}));
}

TEST(Output, ACarriageReturnEndsARedrawPassedOnAtOnce) {
  // A progress bar drawn in place: each bar comes out as soon as its '\r' is read, under its rank's tag, and
  // the line that follows is a line of its own.
  EXPECT_EQ(joined_lines({"[1,0]<stdout>:[##..] step 1\r", "[1,0]<stdout>:[###.] step 2\r[1,1]<stdout>:x\n",
                          "[1,0]<stdout>:epoch done\n"}),
            (std::vector<std::string>{"[1,0]<stdout>:[##..] step 1\r", "[1,0]<stdout>:[###.] step 2\r",
                                      "[1,1]<stdout>:x", "[1,0]<stdout>:epoch done"}));
  TaggedLineJoiner joiner;
  EXPECT_EQ(joiner.feed("[1,0]<stdout>:bar 1\r"), std::vector<std::string>{});  // "\r\n" or a redraw: not known yet
  EXPECT_EQ(joiner.feed("bar 2\r"), (std::vector<std::string>{"[1,0]<stdout>:bar 1\r"}));
  EXPECT_TRUE(TaggedLineJoiner::is_redraw("[1,0]<stdout>:bar 1\r"));
  // "\r\n" is an ordinary end of line, cut between the two or not.
  EXPECT_EQ(joined_lines({"[1,3]<stdout>:dos\r\n"}), (std::vector<std::string>{"[1,3]<stdout>:dos"}));
  EXPECT_EQ(joined_lines({"[1,3]<stdout>:dos\r", "\n"}), (std::vector<std::string>{"[1,3]<stdout>:dos"}));
  EXPECT_FALSE(TaggedLineJoiner::is_redraw("[1,3]<stdout>:dos"));
}

std::vector<std::string> filtered(const std::vector<std::string>& lines) {
  MpirunBannerFilter filter;
  std::vector<std::string> out;
  for (const std::string& line : lines) {
    for (std::string& kept : filter.feed(line)) out.push_back(kept);
  }
  for (std::string& kept : filter.finish()) out.push_back(kept);
  return out;
}

TEST(Output, MpirunsBannersAboutTheJobsEndAreDroppedItsOtherMessagesKept) {
  const std::string dashes(74, '-');
  // As mpirun printed them after one rank's error (MPI_Abort), and after an error all ranks agreed on.
  EXPECT_EQ(filtered({dashes, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD", "with errorcode 1.", "",
                      "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.", dashes,
                      "[host:01234] 1 more process has sent help message help-mpi-api.txt / mpi-abort",
                      "[host:01234] Set MCA parameter \"orte_base_help_aggregate\" to 0 to see all help / error messages",
                      "[host:01235] [[1234,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file "
                      "grpcomm_direct.c at line 355"}),
            std::vector<std::string>{});
  EXPECT_EQ(filtered({dashes, "Primary job  terminated normally, but 1 process returned",
                      "a non-zero exit code. Per user-direction, the job has been aborted.", dashes, dashes,
                      "mpirun detected that one or more processes exited with non-zero status, thus causing",
                      "the job to be terminated. The first process to do so was:", "",
                      "  Process name: [[11685,1],1]", "  Exit code:    1", dashes}),
            std::vector<std::string>{});
  EXPECT_EQ(filtered({dashes, "mpirun noticed that process rank 1 with PID 0 on node h exited on signal 9 (Killed).",
                      dashes}),
            std::vector<std::string>{});
  // Anything else comes out whole: a block that says what to fix, a block never closed, plain lines.
  const std::vector<std::string> other = {dashes, "mpirun was unable to launch the specified application as it",
                                          "could not access or execute an executable:", dashes, "a plain line"};
  EXPECT_EQ(filtered(other), other);
  EXPECT_EQ(filtered({dashes, "cut short"}), (std::vector<std::string>{dashes, "cut short"}));
}

TEST(Resources, TooFewOpenFilesAreRefusedNamingTheLimit) {
  EXPECT_EQ(open_files_refusal(2, 1024), "");
  EXPECT_EQ(open_files_refusal(2, open_files_needed(2)), "");
  const std::string refusal = open_files_refusal(2, 24);
  EXPECT_NE(refusal.find("the open files limit (ulimit -n) is 24, too few for mpirun to start 2 ranks"),
            std::string::npos)
      << refusal;
  EXPECT_NE(open_files_refusal(16, 64), "");  // a limit that 2 ranks fit, 16 do not
  EXPECT_EQ(open_files_refusal(2, 64), "");
}

TEST(Resources, FarMoreRanksThanCoresWarns) {
  // Seen in the field: -np 64 on a 2-core, 24 GiB machine ran silently until the kernel killed ranks.
  const auto warnings = resource_warnings(program(64), with_memory(2, 24));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_TRUE(mentions(warnings, "64 ranks on 2 cores of this node (more than 4 per core)")) << warnings[0];
  EXPECT_TRUE(mentions(warnings, "use -np 8 or fewer"));
  EXPECT_TRUE(mentions(warnings, "64 ranks of about 400 MiB each (--rank-memory-mib) need 25.0 GiB, more than "
                                 "the 24.0 GiB"))
      << warnings[1];
  EXPECT_TRUE(mentions(warnings, "use -np 61 or fewer"));
  // 4 per core and within memory: quiet.
  EXPECT_TRUE(resource_warnings(program(8), with_memory(2, 24)).empty());
  EXPECT_EQ(resource_warnings(program(9), with_memory(2, 24)).size(), 1u);
}

TEST(Resources, MemoryEstimateComesFromTheFlag) {
  LaunchOptions o = program(4);
  o.rank_memory_mib = 8192;
  const auto warnings = resource_warnings(o, with_memory(16, 24));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(mentions(warnings, "need 32.0 GiB")) << warnings[0];
  EXPECT_TRUE(mentions(warnings, "use -np 3 or fewer"));
  o.rank_memory_mib = 0;  // no check
  EXPECT_TRUE(resource_warnings(o, with_memory(16, 24)).empty());
  o.rank_memory_mib = 8192;
  EXPECT_TRUE(resource_warnings(o, with_memory(16, 0)).empty());  // memory unknown: no guess
}

TEST(Resources, OtherNodesAreNotJudgedFromHere) {
  LaunchOptions o = program(64);
  o.hosts = "a:32,b:32";
  EXPECT_TRUE(resource_warnings(o, with_memory(2, 1)).empty());
}

TEST(CommandLine, AMinimumOfRanksMustBePositiveAndAtMostTheRanks) {
  std::string text;
  EXPECT_FALSE(parse({"--min-np", "0", "--", "p"}, &text).options);
  EXPECT_NE(text.find("--min-np must be a positive number of ranks, got 0"), std::string::npos) << text;
  EXPECT_LT(text.size(), 300u) << text;
  EXPECT_FALSE(parse({"-np", "2", "--min-np", "5", "--", "p"}, &text).options);
  EXPECT_NE(text.find("--min-np 5 is more than -np 2"), std::string::npos) << text;
  EXPECT_TRUE(parse({"-np", "4", "--min-np", "2", "--", "p"}).options);
}

TEST(CommandLine, RankMemoryFlag) {
  EXPECT_EQ(parse({"--", "p"}).options->rank_memory_mib, kDefaultRankMemoryMib);
  EXPECT_EQ(parse({"--rank-memory-mib", "2048", "--", "p"}).options->rank_memory_mib, 2048);
  std::string text;
  EXPECT_FALSE(parse({"--rank-memory-mib", "-5", "--", "p"}, &text).options);
  EXPECT_NE(text.find("rank-memory-mib"), std::string::npos) << text;
}

}  // namespace
}  // namespace launcher
}  // namespace ddp
