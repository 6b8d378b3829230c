#include "launcher/failure_tracker.h"

#include <cctype>
#include <cstdio>
#include <sstream>

#include "runtime/core/stop_request.h"

namespace ddp {
namespace launcher {
namespace {

// The integer right after `marker` in `text`, if any.
std::optional<int> number_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + marker.size();
  size_t j = i;
  while (j < text.size() && j - i < 9 && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  if (j == i) return std::nullopt;
  return std::stoi(text.substr(i, j - i));
}

}  // namespace

std::string exit_marker(const ExitMarker& m) {
  return "ddprun-exit: rank=" + std::to_string(m.rank) + " status=" + std::to_string(m.status) +
         " time_ns=" + std::to_string(m.time_ns) + " stopped=" + (m.stopped ? "1" : "0") +
         " asked=" + (m.asked_to_stop ? "1" : "0");
}

std::optional<ExitMarker> parse_exit_marker(const std::string& raw_line) {
  const std::string text = parse_tagged_line(raw_line).text;
  if (!text.starts_with("ddprun-exit: rank=")) return std::nullopt;
  long long r = 0, s = 0, t = 0;
  int stopped = 0;
  int asked = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "ddprun-exit: rank=%lld status=%lld time_ns=%lld stopped=%d asked=%d%c", &r, &s,
                  &t, &stopped, &asked, &tail) != 5 ||
      r < 0 || r > 1000000000 || s < 0 || s > 1000 || (stopped != 0 && stopped != 1) || (asked != 0 && asked != 1)) {
    return std::nullopt;
  }
  ExitMarker m;
  m.rank = static_cast<int>(r);
  m.status = static_cast<int>(s);
  m.time_ns = t;
  m.stopped = stopped == 1;
  m.asked_to_stop = asked == 1;
  return m;
}

void FailureTracker::observe(const std::string& raw_line, long long arrival_ns) {
  if (const std::optional<ExitMarker> marker = parse_exit_marker(raw_line)) {
    observe_marker(*marker);
    return;
  }
  const TaggedLine t = parse_tagged_line(raw_line);
  if (!t.tagged) {
    observe_lost_host(t);
    if (!from_mpirun_) observe_mpirun_report(t);
  }
  if (!report_) observe_report(t, arrival_ns);
}

void FailureTracker::observe_marker(const ExitMarker& m) {
  if (m.status == kStoppedExitStatus) ranks_stopped_as_asked_.insert(m.rank);
  if (m.asked_to_stop) ranks_asked_to_stop_.insert(m.rank);
  if (m.status == 0 || m.stopped || m.asked_to_stop) return;
  std::optional<Evidence>& kind = m.status > 128 ? crash_ : exit_;
  if (!kind || m.time_ns < kind->time_ns) kind = Evidence{m.rank, m.time_ns};
  status_of_.emplace(m.rank, m.status);
}

// mpirun's own line untagged: "Remote daemon: [[J,0],D] on node HOST".
void FailureTracker::observe_lost_host(const TaggedLine& t) {
  if (!lost_host_.empty()) return;
  const size_t daemon = t.text.find("Remote daemon: [[");
  const size_t node = daemon == std::string::npos ? daemon : t.text.find(" on node ", daemon);
  if (node != std::string::npos) {
    std::stringstream rest(t.text.substr(node + 9));
    rest >> lost_host_;
  }
  // ssh's own word for the same loss, which mpirun's report does not always follow (it depends on when the
  // daemon's connection breaks): "Connection to node3 closed by remote host."
  const size_t ssh_lost = t.text.find("Connection to ");
  if (ssh_lost != std::string::npos && t.text.find(" closed by remote host", ssh_lost) != std::string::npos &&
      lost_host_.empty()) {
    std::stringstream rest(t.text.substr(ssh_lost + 14));
    rest >> lost_host_;
  }
}

void FailureTracker::observe_mpirun_report(const TaggedLine& t) {
  const std::string& text = t.text;
  // "  Process name: [[3346,1],1]": the first process to exit non-zero.
  const size_t at = text.find("Process name: [[");
  if (at != std::string::npos) {
    const size_t close = text.find("],", at);
    if (close != std::string::npos) from_mpirun_ = number_after(text, text.substr(at, close - at + 2));
  }
  if (!from_mpirun_) from_mpirun_ = number_after(text, "mpirun noticed that process rank ");
  if (!from_mpirun_) from_mpirun_ = number_after(text, "MPI_ABORT was invoked on rank ");
}

void FailureTracker::observe_report(const TaggedLine& t, long long arrival_ns) {
  const std::string& text = t.text;
  // The lines after "error: WHAT:" list the ranks that raised it: "  rank 2: ..." or "  ranks 0,3: ...".
  if (agreed_error_printer_ && t.tagged && t.rank == *agreed_error_printer_) {
    std::optional<int> listed;
    if (text.starts_with("  rank ")) listed = number_after(text, "  rank ");
    if (text.starts_with("  ranks ")) listed = number_after(text, "  ranks ");
    report_ = Evidence{listed.value_or(t.rank), arrival_ns};  // no list after all: the printer is all we know
    return;
  }
  if (text.starts_with("error: ") && text.back() == ':') {
    agreed_error_printer_ = t.tagged ? t.rank : 0;
    if (!t.tagged) report_ = Evidence{0, arrival_ns};
    return;
  }
  // "rank R: error: ..." or "rank R: fatal: ..." (anywhere in the line).
  for (size_t at = text.find("rank "); at != std::string::npos; at = text.find("rank ", at + 1)) {
    const std::optional<int> r = number_after(text.substr(at), "rank ");
    if (!r) continue;
    const size_t after = at + 5 + std::to_string(*r).size();
    if (text.compare(after, 9, ": error: ") == 0 || text.compare(after, 9, ": fatal: ") == 0) {
      report_ = Evidence{t.tagged ? t.rank : *r, arrival_ns};
      return;
    }
  }
}

std::optional<int> FailureTracker::first_failed_rank() const {
  // The earliest marker: crashes and exits alike, each at the time the wrapper saw it.
  std::optional<Evidence> marker = crash_;
  bool marker_is_crash = crash_.has_value();
  if (exit_ && (!marker || exit_->time_ns < marker->time_ns)) {
    marker = exit_;
    marker_is_crash = false;
  }
  if (marker && report_) {
    const long long slack = marker_is_crash ? 0 : kRelaySlackNs;
    return marker->time_ns + slack <= report_->time_ns ? marker->rank : report_->rank;
  }
  if (marker) return marker->rank;
  if (report_) return report_->rank;
  return from_mpirun_;
}

std::string FailureTracker::first_failure_how() const {
  const std::optional<int> rank = first_failed_rank();
  if (!rank || status_of_.count(*rank) == 0) return "";
  const int status = status_of_.at(*rank);
  return status > 128 ? "signal " + std::to_string(status - 128) : "exit status " + std::to_string(status);
}

}  // namespace launcher
}  // namespace ddp
