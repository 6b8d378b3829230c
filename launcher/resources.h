// What this node can carry of a job, said before it starts: a job the node cannot hold would otherwise wait
// forever (too few open files for mpirun) or crawl and be killed (too many ranks per core, too little memory).
#pragma once

#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/machine.h"

namespace ddp {
namespace launcher {

// More ranks than this per core draws a warning: they would mostly wait for a core (see resource_warnings).
constexpr int kMaxRanksPerCore = 4;

// The open files mpirun needs on this node to start `ranks_here` ranks (its own, and per rank the pipes and
// sockets of the rank and its wrapper), with some room: below it, mpirun starts no rank and waits forever.
long long open_files_needed(int ranks_here);
// Why an open-files limit (ulimit -n) of `limit` cannot start `ranks_here` ranks, naming the limit and what to
// do; "" when it can.
std::string open_files_refusal(int ranks_here, long long limit);

// Warnings, printed before the job starts, for a job on this node alone that the node cannot carry: more than
// kMaxRanksPerCore ranks per core, or ranks whose estimated memory (np x rank_memory_mib) exceeds what is
// available. Warnings only: the job still runs (a user may know better, e.g. ranks that mostly sleep). Jobs
// over --hosts/--hostfile are not checked: the other nodes' cores and memory are not visible from here.
std::vector<std::string> resource_warnings(const LaunchOptions& options, const MachineFacts& facts);

}  // namespace launcher
}  // namespace ddp
