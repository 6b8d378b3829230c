// The processes of a job on this node, found through /proc: ddprun starts only mpirun, yet it must reach the
// rank wrappers mpirun starts (to hand them a graceful stop once each can take it) and every process of the
// job (to stop them all at Ctrl-Z), and tell whether a process catches a signal before sending it one.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// A file's whole text ("" when it cannot be read): /proc's files, whose size stat does not give.
std::string read_text(const std::string& path);
// The processes /proc lists now.
std::vector<pid_t> process_ids();
// Each process's parent, from /proc.
std::map<pid_t, pid_t> parent_links();
// The processes below `root` on this node (its children, theirs, ...).
std::vector<pid_t> descendants(pid_t root, const std::map<pid_t, pid_t>& parent_of);
// The rank wrappers on this node among the descendants of `root` (mpirun), each once it runs the wrapper.
std::vector<pid_t> local_rank_wrappers(pid_t root);
// Whether process `pid` catches `sig` (its handler is installed): the SigCgt mask of /proc/PID/status.
bool catches_signal(pid_t pid, int sig);

}  // namespace launcher
}  // namespace ddp
