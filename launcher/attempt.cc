#include "launcher/attempt.h"

#include <algorithm>

#include "launcher/command.h"
#include "runtime/core/check.h"

namespace ddp {
namespace launcher {

AttemptPlan plan_attempt(const LaunchOptions& options, const MachineFacts& facts,
                         const std::vector<HostAnswer>& answers) {
  const std::vector<HostSlots> hosts = job_hosts(options);
  DDP_CHECK(answers.size() == hosts.size(), "plan_attempt: " + std::to_string(answers.size()) + " answers for " +
                                                std::to_string(hosts.size()) + " hosts");
  AttemptPlan plan;
  plan.options = options;
  std::string kept;
  int kept_slots = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (answers[i].reachable) {
      plan.facts.push_back(answers[i].facts);
      kept += (kept.empty() ? "" : ",") + hosts[i].host + ":" + std::to_string(hosts[i].slots);
      kept_slots += hosts[i].slots;
    } else {
      plan.lost.push_back(hosts[i].host + " (" + answers[i].error + ")");
    }
  }
  if (plan.lost.empty()) return plan;
  std::string lost;
  for (const std::string& l : plan.lost) lost += (lost.empty() ? "" : ", ") + l;
  const int np = std::min(resolve_np(options, facts), kept_slots);
  if (options.min_np == 0) {
    plan.refusal = "cannot reach " + lost + "; pass --min-np N to go on with the hosts that answer when N ranks fit";
  } else if (np < options.min_np) {
    plan.refusal = "cannot reach " + lost + ", and the hosts that answer have slots for " + std::to_string(np) +
                   " rank" + (np == 1 ? "" : "s") + ", fewer than --min-np " + std::to_string(options.min_np);
  } else {
    plan.options.hosts = kept;
    plan.options.hostfile.clear();
    plan.options.np = np;
  }
  return plan;
}

}  // namespace launcher
}  // namespace ddp
