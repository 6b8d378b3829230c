// Which hosts and how many ranks each attempt of a job over several hosts runs with: the elastic part of
// --max-restarts, decided from what the hosts' probes answered. Pure, so every loss is unit-tested.
#pragma once

#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/hosts.h"
#include "launcher/machine.h"

namespace ddp {
namespace launcher {

// Before each attempt of a job over several hosts: what the probes found, and which hosts and how many ranks
// the attempt runs with. Hosts that did not answer are dropped when --min-np allows (np becomes the smaller of
// -np and the slots left, at least --min-np); a host that answers again is taken back, up to the original np.
struct HostAnswer {
  bool reachable = false;
  HostFacts facts;
  std::string error;  // why not, from mpirun's output
};
struct AttemptPlan {
  LaunchOptions options;            // for this attempt: --hosts of the hosts kept, np set, when some were dropped
  std::vector<HostFacts> facts;     // of the hosts kept, in order
  std::vector<std::string> lost;    // "host (why)" of each host dropped
  std::string refusal;              // non-empty: too few ranks left; the job cannot (re)start
};
AttemptPlan plan_attempt(const LaunchOptions& options, const MachineFacts& facts,
                         const std::vector<HostAnswer>& answers);

}  // namespace launcher
}  // namespace ddp
