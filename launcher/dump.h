// ddprun --dump: asks a running job for its ranks' flight recorders without stopping it, for a job that seems
// stuck; the user names ddprun's pid, or the one job of theirs is found.
#pragma once

#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// ddprun --dump [PID]: sends SIGUSR2 to the ddprun whose pid is `pid`, or, without one, to the one ddprun of
// this user that runs a job; that ddprun passes it to every rank, and each prints its flight recorder (its last
// collectives and its phase) while the job goes on. Returns 0 once sent, 1 when there is no such job (or more
// than one and no pid), with the reason on stderr.
int dump_job(const std::vector<std::string>& args);

}  // namespace launcher
}  // namespace ddp
