// Asking the hosts of a job what they have before it starts (hosts.h says why a probe): ddprun starts itself
// on every host at once through mpirun and reads each one's probe line, or why it did not come.
#pragma once

#include <string>
#include <vector>

#include "launcher/attempt.h"
#include "launcher/hosts.h"
#include "launcher/machine.h"

namespace ddp {
namespace launcher {

// Asks every host of `hosts` at once what it has, by starting `self` (ddprun's own path) there with kProbeFlag
// through mpirun (build_probe_command): one answer per host, in order. A host whose probe does not print its
// line within `timeout_ms` (ssh refused or hanging, a node down) is unreachable, with the first line mpirun
// said about it as the reason. Probes still running at the deadline are killed.
constexpr int kProbeTimeoutMs = 30000;
std::vector<HostAnswer> probe_hosts(const std::vector<HostSlots>& hosts, const MachineFacts& facts,
                                    const std::string& self, int timeout_ms = kProbeTimeoutMs);

}  // namespace launcher
}  // namespace ddp
