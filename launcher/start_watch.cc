#include "launcher/start_watch.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"

namespace ddp {
namespace launcher {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void StartWatch::observe(const StartMarker& marker) {
  if (marker.rank < 0 || marker.rank >= ranks_) return;
  if (!deadline_) {
    deadline_.emplace(timeout_s_);
    first_rank_ = marker.rank;
  }
  begun_.insert(marker.rank);
  if (marker.mpi_ready) ready_.insert(marker.rank);
}

std::string StartWatch::overdue() {
  if (reported_ || !waiting() || !deadline_->passed()) return "";
  reported_ = true;
  std::vector<int> never, inside;
  for (int r = 0; r < ranks_; ++r) {
    if (!begun_.count(r)) never.push_back(r);
    if (begun_.count(r) && !ready_.count(r)) inside.push_back(r);
  }
  late_rank_ = !never.empty() ? never.front() : inside.front();
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g s", timeout_s_);
  std::string what = "the job did not start within " + std::string(timeout) +
                     " (the start's deadline: DDP_COLLECTIVE_TIMEOUT_S, at least 10 s) of rank " +
                     std::to_string(first_rank_) + " starting MPI: ";
  if (!never.empty()) {
    what += ranks_text(never) + " never began" +
            " MPI_Init (stopped, or stuck before its session)";
    if (!inside.empty()) what += "; " + ranks_text(inside) + (inside.size() == 1 ? " waits" : " wait") + " in it";
  } else {
    what += ranks_text(inside) + " did not get through MPI_Init (stopped or stuck inside it, or MPI cannot connect "
            "the ranks)";
  }
  return what + "; ending the job";
}

double start_timeout_s() {
  double timeout_s = 300.0;
  try {
    timeout_s = settings::seconds(settings::setting("DDP_COLLECTIVE_TIMEOUT_S"));
  } catch (const Error&) {
  }
  return std::max(timeout_s, kMinStartTimeoutS);
}

}  // namespace launcher
}  // namespace ddp
