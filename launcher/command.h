// The mpirun commands ddprun runs, built from its options and the facts of the machine: the job's, and the
// probe's that asks a host what it has. Pure, so every kind of machine and option is unit-tested.
//
// Why mpirun underneath: it already starts ranks on one or many nodes, wires up MPI (which bootstraps NCCL
// here), binds processes to cores, and tears the job down when one rank dies. ddprun adds the defaults a
// training job wants (one rank per GPU, sane binding, root and oversubscription handled, DDP_*/NCCL_* variables
// forwarded), readable "[rank R] " prefixes, a clear account of failures, and restarts from checkpoints.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/hosts.h"
#include "launcher/machine.h"

namespace ddp {
namespace launcher {

// OpenBLAS's kernel for the ranks where the user names none (OPENBLAS_CORETYPE) and the CPU has AVX2 and FMA:
// left to itself, OpenBLAS picks by the CPU (Cooperlake, SkylakeX, Zen...), and each kernel sums the products in
// its own order, so the same job would give other bits on another machine, and the CPU records
// (tests/examples/train_mlp_outputs.cpu.txt) hold only on the Haswell kernel's. OpenBLAS reads the variable once,
// when it is loaded, so it must be in the ranks' environment before they start. tools/test.sh reads this line.
constexpr const char* kOpenBlasCoreType = "Haswell";

// The hosts of --hosts or --hostfile; empty for a job on this node.
std::vector<HostSlots> job_hosts(const LaunchOptions& options);

// The number of ranks to start: -np, else the host list's slots, else the node's GPUs, else 2.
int resolve_np(const LaunchOptions& options, const MachineFacts& facts);

// The full mpirun argv. `extra_env` is set in every rank (`-x K=V`) on top of what is forwarded (restarts use
// it for DDP_RESTART and DDP_RESUME). Throws InvalidArgument for inconsistent options.
// With a non-empty `rank_wrapper` (ddprun's own path) each rank runs as
// "RANK_WRAPPER --ddprun-rank-wrapper -- PROGRAM ARGS" so its exit is reported with a time stamp; the wrapper
// must exist at the same path on every node, like the program.
std::vector<std::string> build_mpirun_command(const LaunchOptions& options, const MachineFacts& facts,
                                              const std::map<std::string, std::string>& extra_env = {},
                                              const std::string& rank_wrapper = "");
constexpr const char* kRankWrapperFlag = "--ddprun-rank-wrapper";
// The mpirun command that starts `probe` (ddprun's own path) with kProbeFlag once on `host` (hosts.h). With a
// `session_base`, that mpirun keeps its session directory under it instead of the shared TMPDIR: the probes of
// all hosts run at once, and mpiruns of one machine sharing TMPDIR race on its top directory (one removes it
// at exit while another creates its own: "A call to mkdir was unable to create the desired directory").
std::vector<std::string> build_probe_command(const std::string& host, const MachineFacts& facts,
                                             const std::string& probe, const std::string& session_base = "");

}  // namespace launcher
}  // namespace ddp
