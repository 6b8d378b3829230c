#include "runtime/distributed/hang_diagnosis/stall_report.h"

#include <algorithm>
#include <map>
#include <utility>

namespace ddp {
namespace {

// How the report names ranks: by their number in the session's communicator, with their world rank beside it
// when the two differ (a session on a split communicator), since ddprun's and mpirun's prefixes are world ranks.
class RankNames {
 public:
  explicit RankNames(const std::vector<RankState>& ranks) {
    for (const RankState& r : ranks) {
      if (r.rank >= 0) world_[r.rank] = r.world_rank;
      renumbered_ = renumbered_ || (r.world_rank >= 0 && r.world_rank != r.rank);
    }
  }
  // "ranks 0,1,3", or "session ranks 0,1 (world ranks 2,3)".
  std::string operator()(const std::vector<int>& ranks) const {
    const std::string word = ranks.size() == 1 ? "rank " : "ranks ";
    if (!renumbered_) return word + rank_list(ranks);
    std::vector<int> sorted = ranks, world;
    std::sort(sorted.begin(), sorted.end());
    for (int r : sorted) {
      const auto it = world_.find(r);
      world.push_back(it == world_.end() ? -1 : it->second);
    }
    std::string world_text;
    for (std::size_t i = 0; i < world.size(); ++i) {
      world_text += (i ? "," : "") + (world[i] >= 0 ? std::to_string(world[i]) : std::string("?"));
    }
    return "session " + word + rank_list(sorted) + " (world " + word + world_text + ")";
  }

 private:
  std::map<int, int> world_;
  bool renumbered_ = false;
};

// Ranks grouped by a text (kept in order of first appearance), for clauses such as "ranks 0,1,3 wait in ...".
class Groups {
 public:
  void add(const std::string& key, int rank) {
    for (auto& [text, ranks] : groups_) {
      if (text == key) {
        ranks.push_back(rank);
        return;
      }
    }
    groups_.emplace_back(key, std::vector<int>{rank});
  }
  const std::vector<std::pair<std::string, std::vector<int>>>& items() const { return groups_; }

 private:
  std::vector<std::pair<std::string, std::vector<int>>> groups_;
};

std::string collective_text(const CollectiveState& c) { return "#" + std::to_string(c.seq) + " (" + c.text() + ")"; }

// Where a rank that is behind is: its last collective and its phase.
std::string whereabouts(const RankState& r) {
  const CollectiveState* last = r.last_issued();
  return "last collective " + (last != nullptr ? collective_text(*last) : std::string("none recorded")) + ", " +
         r.phase_text();
}

// "MPI_Bcast of 100 float32 (step 2)": what a rank issued, then what for.
std::string issued_text(const CollectiveState& c) {
  std::string s = c.operation;
  if (c.count > 0) s += " of " + std::to_string(c.count) + " " + dtype_name(c.dtype);
  s += " (";
  if (c.bucket >= 0) s += "bucket " + std::to_string(c.bucket) + " of " + std::to_string(c.buckets) + ", ";
  return s + "step " + std::to_string(c.step) + ")";
}

// When the ranks issued different collectives under one sequence number: each side, the smaller first.
std::string mismatch_clause(std::int64_t seq, const std::vector<const RankState*>& issued,
                            const RankNames& names) {
  std::vector<std::pair<const CollectiveState*, std::vector<int>>> sides;
  for (const RankState* r : issued) {
    const CollectiveState* c = r->find(seq);
    if (c == nullptr) continue;
    auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& x) { return x.first->same_collective(*c); });
    if (side == sides.end()) {
      sides.emplace_back(c, std::vector<int>{r->rank});
    } else {
      side->second.push_back(r->rank);
    }
  }
  if (sides.size() < 2) return "";
  std::stable_sort(sides.begin(), sides.end(), [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  std::string s = "the ranks differ in #" + std::to_string(seq) + ": ";
  for (std::size_t k = 0; k < sides.size(); ++k) {
    s += (k ? ", " : "") + names(sides[k].second) + " issued " + issued_text(*sides[k].first);
  }
  return s + "; each waits in its own (DDP_DEBUG=collectives stops at the first difference, naming both sides)";
}

}  // namespace

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    if (j - i >= 3) {
      s += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      for (std::size_t k = i; k <= j; ++k) s += (k > i ? "," : "") + std::to_string(ranks[k]);
    }
    i = j + 1;
  }
  return s;
}

std::string explain_stall(const std::vector<RankState>& ranks) {
  const RankNames names(ranks);
  std::vector<const RankState*> answered;
  Groups silent;
  for (const RankState& r : ranks) {
    if (r.answered) {
      answered.push_back(&r);
    } else {
      silent.add(r.no_answer, r.rank);
    }
  }

  // The first collective some rank waits in holds the job up: whoever has not issued it is behind.
  std::int64_t stuck_seq = 0;
  for (const RankState* r : answered) {
    if (const CollectiveState* c = r->oldest_in_flight()) {
      if (stuck_seq == 0 || c->seq < stuck_seq) stuck_seq = c->seq;
    }
  }

  std::vector<std::string> clauses;
  std::vector<const RankState*> issued_it;
  Groups behind;
  Groups ahead;  // finished the stuck collective (a broadcast's root may) and went on
  Groups waiting;
  for (const RankState* r : answered) {
    const CollectiveState* last = r->last_issued();
    if (stuck_seq > 0 && (last == nullptr || last->seq < stuck_seq)) {
      behind.add(whereabouts(*r), r->rank);
      continue;
    }
    if (stuck_seq > 0) issued_it.push_back(r);
    if (const CollectiveState* c = r->oldest_in_flight()) {
      waiting.add(collective_text(*c), r->rank);
    } else if (stuck_seq > 0) {
      ahead.add(whereabouts(*r), r->rank);
    }
  }
  for (const auto& [where, group] : behind.items()) {
    clauses.push_back(names(group) + (group.size() == 1 ? " is" : " are") + " behind: " + where);
  }
  for (const auto& [where, group] : ahead.items()) {
    clauses.push_back(names(group) + (group.size() == 1 ? " is" : " are") + " past #" +
                      std::to_string(stuck_seq) + ": " + where);
  }
  for (const auto& [why, group] : silent.items()) {
    clauses.push_back(names(group) + " did not answer (" + why + ")");
  }
  const std::string mismatch = stuck_seq > 0 ? mismatch_clause(stuck_seq, issued_it, names) : "";
  if (!mismatch.empty()) clauses.push_back(mismatch);
  for (const auto& [what, group] : waiting.items()) {
    if (!mismatch.empty() && what.rfind("#" + std::to_string(stuck_seq) + " ", 0) == 0) continue;  // said above
    clauses.push_back(names(group) + (group.size() == 1 ? " waits in " : " wait in ") + what);
  }
  if (stuck_seq == 0) {
    clauses.push_back("no rank that answered waits in a collective now (the late one may have completed)");
    for (const RankState* r : answered) clauses.push_back(names({r->rank}) + ": " + whereabouts(*r));
  } else if (behind.items().empty() && silent.items().empty() && mismatch.empty()) {
    clauses.push_back("every rank issued #" + std::to_string(stuck_seq) +
                      " and none is behind: the collective itself is stuck (the network, NCCL, or a GPU that "
                      "stopped)");
  }
  std::string line;
  for (const std::string& c : clauses) line += (line.empty() ? "" : "; ") + c;
  return line;
}

}  // namespace ddp
