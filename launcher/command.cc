#include "launcher/command.h"

#include <algorithm>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"

namespace ddp {
namespace launcher {
namespace {

// Each rank an equal block of its host's cores (its compute, BLAS and communication threads), on its GPU's
// NUMA node where the hosts allow, so ranks neither migrate nor share cores (hosts.h). World binds rank r to
// GPU local_rank % gpus. Hosts not probed are taken to be like this one.
std::vector<std::string> binding_for(const LaunchOptions& options, const MachineFacts& facts, int np) {
  HostFacts here;
  here.cores = std::max(1, facts.cores);
  here.numa_cores = facts.numa_cores;
  here.gpu_numa = facts.gpu_numa;
  if (here.gpus() != facts.gpus) here.gpu_numa.assign(static_cast<size_t>(std::max(0, facts.gpus)), -1);
  std::vector<PlacedHost> placed;
  const std::vector<HostSlots> hosts = job_hosts(options);
  if (hosts.empty()) placed.push_back(PlacedHost{HostSlots{"", np}, here});
  for (size_t i = 0; i < hosts.size(); ++i) {
    placed.push_back(PlacedHost{hosts[i], i < facts.hosts.size() ? facts.hosts[i] : here});
  }
  return binding_arguments(np, placed);
}

// The MCA parameters ddprun sets for the job.
std::vector<std::string> mca_arguments(const LaunchOptions& options, const MachineFacts& facts) {
  std::vector<std::string> args;
  // A job on this node alone takes Open MPI's shared-memory path (pml ob1) by name: left to choose, MPI_Init
  // first opens and probes the interconnect libraries a job that never leaves the node has no use for (PSM,
  // PSM2, OFI), a quarter of a second or more of every start. Jobs over several hosts keep Open MPI's choice,
  // and a user's own OMPI_MCA_pml wins.
  if (job_hosts(options).empty() && facts.env.count("OMPI_MCA_pml") == 0) {
    args.insert(args.end(), {"--mca", "pml", "ob1"});
  }
  // Inside a Slurm job, a time limit or scancel signals every process of the job at once, mpirun too, which
  // would end its ranks 1 s later (odls_base_sigkill_timeout) in the middle of the stop the same signal asked
  // them for. mpirun sends its SIGTERM after that timeout and its SIGKILL, and exits, about as long again
  // later: half the stop grace each keeps its end inside the grace (and inside Slurm's KillWait, when the
  // grace is). The price: a failed job under Slurm takes about the grace to be torn down (docs/slurm.md).
  if (facts.env.count("SLURM_JOB_ID") > 0) {
    args.insert(args.end(),
                {"--mca", "odls_base_sigkill_timeout", std::to_string(std::max(1, options.stop_grace_s / 2))});
  }
  return args;
}

// The ranks' environment: "-x NAME" for each variable forwarded from ddprun's, "-x NAME=VALUE" for each set.
std::vector<std::string> environment_arguments(const LaunchOptions& options, const MachineFacts& facts,
                                               const std::map<std::string, std::string>& extra_env) {
  std::map<std::string, std::string> set = extra_env;
  if (!options.backend.empty()) set[std::string(settings::setting("DDP_BACKEND").name)] = options.backend;
  // NVLink SHARP (NVLS) multicast is off unless the user asks: it needs fabric support many hosts lack.
  if (facts.env.count("NCCL_NVLS_ENABLE") == 0 && set.count("NCCL_NVLS_ENABLE") == 0) set["NCCL_NVLS_ENABLE"] = "0";
  // One OpenBLAS kernel on every machine (kOpenBlasCoreType); a user's own choice is forwarded as it is.
  if (facts.avx2_fma && facts.env.count("OPENBLAS_CORETYPE") == 0 && set.count("OPENBLAS_CORETYPE") == 0) {
    set["OPENBLAS_CORETYPE"] = kOpenBlasCoreType;
  }
  std::vector<std::string> args;
  for (const auto& [name, value] : facts.env) {
    if ((name.starts_with("DDP_") || name.starts_with("NCCL_") || name == "OPENBLAS_CORETYPE") &&
        set.count(name) == 0) {
      args.insert(args.end(), {"-x", name});
    }
  }
  for (const auto& [name, value] : set) args.insert(args.end(), {"-x", name + "=" + value});
  return args;
}

}  // namespace

std::vector<HostSlots> job_hosts(const LaunchOptions& options) {
  if (!options.hosts.empty()) return parse_hosts(options.hosts);
  if (!options.hostfile.empty()) return parse_hostfile(options.hostfile);
  return {};
}

int resolve_np(const LaunchOptions& options, const MachineFacts& facts) {
  if (options.np > 0) return options.np;
  if (!options.hosts.empty()) {
    int total = 0;
    for (const HostSlots& h : parse_hosts(options.hosts)) total += h.slots;
    return total;
  }
  if (!options.hostfile.empty()) return hostfile_slots(options.hostfile);
  return facts.gpus > 0 ? facts.gpus : 2;
}

std::vector<std::string> build_mpirun_command(const LaunchOptions& options, const MachineFacts& facts,
                                              const std::map<std::string, std::string>& extra_env,
                                              const std::string& rank_wrapper) {
  if (options.program.empty()) throw InvalidArgument("ddprun: no program to run");
  if (!options.hosts.empty() && !options.hostfile.empty()) {
    throw InvalidArgument("ddprun: --hosts and --hostfile exclude each other; give one");
  }
  if (options.np < 0) throw InvalidArgument("ddprun: -np must be positive, got " + std::to_string(options.np));
  const int np = resolve_np(options, facts);
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(np)};
  if (facts.root) cmd.push_back("--allow-run-as-root");
  if (!options.hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", options.hosts});
  } else if (!options.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", options.hostfile});
  }
  for (const std::vector<std::string>& part :
       {binding_for(options, facts, np), std::vector<std::string>{"--tag-output"}, mca_arguments(options, facts),
        environment_arguments(options, facts, extra_env)}) {
    cmd.insert(cmd.end(), part.begin(), part.end());
  }
  if (!rank_wrapper.empty()) cmd.insert(cmd.end(), {rank_wrapper, kRankWrapperFlag, "--"});
  cmd.insert(cmd.end(), options.program.begin(), options.program.end());
  return cmd;
}

std::vector<std::string> build_probe_command(const std::string& host, const MachineFacts& facts,
                                             const std::string& probe, const std::string& session_base) {
  std::vector<std::string> cmd = {"mpirun", "-np", "1"};
  if (facts.root) cmd.push_back("--allow-run-as-root");
  if (!session_base.empty()) cmd.insert(cmd.end(), {"--mca", "orte_local_tmpdir_base", session_base});
  // Unbound, so that the probe sees every core the host gives the job.
  cmd.insert(cmd.end(), {"--host", host, "--bind-to", "none", probe, kProbeFlag});
  return cmd;
}

}  // namespace launcher
}  // namespace ddp
