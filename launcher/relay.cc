#include "launcher/relay.h"

#include <algorithm>
#include <cctype>

namespace ddp {
namespace launcher {

TaggedLine parse_tagged_line(const std::string& line) {
  TaggedLine t;
  t.text = line;
  // "[J,R]<stream>:text"
  if (line.size() < 6 || line[0] != '[') return t;
  const size_t comma = line.find(',');
  const size_t close = line.find(']');
  if (comma == std::string::npos || close == std::string::npos || comma > close || close + 1 >= line.size() ||
      line[close + 1] != '<') {
    return t;
  }
  const std::string job = line.substr(1, comma - 1);
  const std::string rank = line.substr(comma + 1, close - comma - 1);
  const size_t end = line.find(">:", close);
  int rank_value = 0;
  if (job.empty() || !std::all_of(job.begin(), job.end(), ::isdigit) || end == std::string::npos ||
      rank.empty() || rank.size() > 9 || !std::all_of(rank.begin(), rank.end(), ::isdigit)) {
    return t;
  }
  rank_value = std::stoi(rank);
  t.tagged = true;
  t.rank = rank_value;
  t.stream = line.substr(close + 2, end - close - 2);
  t.text = line.substr(end + 2);
  return t;
}

namespace {


// The length of the tag "[J,R]<stream>:" at `at` of `text`; 0 when there is none there; -1 when `text` ends
// before it could be told (a tag may be cut across two reads).
long tag_length_at(const std::string& text, size_t at) {
  size_t i = at;
  auto more = [&] { return i < text.size(); };
  if (!more()) return -1;
  if (text[i++] != '[') return 0;
  for (int part = 0; part < 2; ++part) {
    const size_t digits = i;
    while (more() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (!more()) return -1;
    if (i == digits || i - digits > 9 || text[i++] != (part == 0 ? ',' : ']')) return 0;
  }
  if (!more()) return -1;
  if (text[i++] != '<') return 0;
  const size_t name = i;
  while (more() && std::islower(static_cast<unsigned char>(text[i]))) ++i;
  if (!more()) return -1;
  if (i == name || i - name > 8 || text[i++] != '>') return 0;
  if (!more()) return -1;
  if (text[i++] != ':') return 0;
  return static_cast<long>(i - at);
}


}  // namespace

std::string& TaggedLineJoiner::line_of(const std::string& tag) {
  for (auto& [t, line] : partial_) {
    if (t == tag) return line;
  }
  partial_.emplace_back(tag, "");
  return partial_.back().second;
}

void TaggedLineJoiner::emit_tagged(const std::string& tag, std::vector<std::string>* lines) {
  for (auto it = partial_.begin(); it != partial_.end(); ++it) {
    if (it->first != tag) continue;
    lines->push_back(tag + it->second);
    partial_.erase(it);
    return;
  }
}

std::vector<std::string> TaggedLineJoiner::feed(const std::string& bytes) {
  pending_ += bytes;
  std::vector<std::string> lines;
  size_t i = 0;
  while (i < pending_.size()) {
    if (pending_[i] == '[') {
      const long tag = tag_length_at(pending_, i);
      if (tag < 0) break;  // perhaps a tag cut in two: wait for the rest
      if (tag > 0) {
        if (!untagged_.empty()) {  // mpirun's own text cut by a rank's piece: a line of its own
          lines.push_back(untagged_);
          untagged_.clear();
        }
        current_tag_ = pending_.substr(i, static_cast<size_t>(tag));
        line_of(current_tag_);
        i += static_cast<size_t>(tag);
        continue;
      }
    }
    bool wait = false;
    i = take_text(i, &lines, &wait);
    if (wait) break;
  }
  pending_.erase(0, i);
  return lines;
}

size_t TaggedLineJoiner::take_text(size_t at, std::vector<std::string>* lines, bool* wait) {
  // Up to the next newline, carriage return or '[' (which may start a tag), whichever comes first.
  size_t end = pending_.find_first_of("\n\r[", at + 1);
  if (pending_[at] == '\n' || pending_[at] == '\r') end = at;
  if (end == std::string::npos) end = pending_.size();
  if (end < pending_.size() && pending_[end] == '\r' && !current_tag_.empty()) {
    return take_redraw(at, end, lines, wait);
  }
  if (end < pending_.size() && pending_[end] == '\r') {  // in mpirun's own text: text, up to the next stop
    end = pending_.find_first_of("\n[", end + 1);
    if (end == std::string::npos) end = pending_.size();
  }
  const bool newline = end < pending_.size() && pending_[end] == '\n';
  append_piece(pending_.substr(at, end - at), newline, lines);
  return newline ? end + 1 : end;
}

// A carriage return ends a rank's redraw, unless a newline follows it ("\r\n"); one at the very end of the
// bytes so far waits for the next byte to tell.
size_t TaggedLineJoiner::take_redraw(size_t at, size_t carriage_return, std::vector<std::string>* lines,
                                     bool* wait) {
  const size_t end = carriage_return;
  if (end + 1 == pending_.size()) {
    line_of(current_tag_) += pending_.substr(at, end - at);
    *wait = true;
    return end;
  }
  if (pending_[end + 1] != '\n') {
    line_of(current_tag_) += pending_.substr(at, end - at) + "\r";
    emit_tagged(current_tag_, lines);  // the piece runs on under the same tag (the next redraw, or the line)
    return end + 1;
  }
  line_of(current_tag_) += pending_.substr(at, end - at);
  return end + 1;  // the newline ends the line on the next turn
}

void TaggedLineJoiner::append_piece(const std::string& piece, bool ends_line, std::vector<std::string>* lines) {
  if (!current_tag_.empty()) {
    line_of(current_tag_) += piece;
    if (ends_line) {
      emit_tagged(current_tag_, lines);
      current_tag_.clear();
    }
  } else {
    untagged_ += piece;
    if (ends_line) {
      lines->push_back(untagged_);
      untagged_.clear();
    }
  }
}

std::vector<std::string> TaggedLineJoiner::finish() {
  std::vector<std::string> lines = feed("");
  if (!pending_.empty()) {
    // A cut tag at the very end: text, then.
    if (!current_tag_.empty()) {
      for (auto& [tag, line] : partial_) {
        if (tag == current_tag_) line += pending_;
      }
    } else {
      untagged_ += pending_;
    }
    pending_.clear();
  }
  if (!untagged_.empty()) lines.push_back(untagged_);
  untagged_.clear();
  for (const auto& [tag, line] : partial_) {
    if (!line.empty()) lines.push_back(tag + line);
  }
  partial_.clear();
  current_tag_.clear();
  return lines;
}

std::string rewrite_tagged_line(const std::string& line) {
  const TaggedLine t = parse_tagged_line(line);
  if (!t.tagged) return line;
  // The runtime's own "rank R: error: ..." (for plain mpirun) says the rank the prefix already says.
  const std::string own = "rank " + std::to_string(t.rank) + ": ";
  const bool says_rank = t.text.rfind(own, 0) == 0;
  return "[rank " + std::to_string(t.rank) + "] " + (says_rank ? t.text.substr(own.size()) : t.text);
}

namespace {

bool is_dash_line(const std::string& line) {
  return line.size() >= 20 && line.find_first_not_of('-') == std::string::npos;
}

// A banner of mpirun's about the job's end, which ddprun says in its own words.
bool is_end_banner(const std::vector<std::string>& block) {
  static const char* const kPhrases[] = {
      "MPI_ABORT was invoked on rank",
      "Primary job  terminated normally",
      "Primary job terminated normally",
      "mpirun detected that one or more processes exited with non-zero status",
      "mpirun noticed that process rank",
      "exiting improperly",
  };
  for (const std::string& line : block) {
    for (const char* phrase : kPhrases) {
      if (line.find(phrase) != std::string::npos) return true;
    }
  }
  return false;
}

// mpirun's loose lines about the same end.
bool is_end_noise(const std::string& line) {
  return line.find("ORTE_ERROR_LOG") != std::string::npos ||
         (line.find("more process") != std::string::npos && line.find("sent help message") != std::string::npos) ||
         line.find("orte_base_help_aggregate") != std::string::npos;
}

}  // namespace

std::vector<std::string> MpirunBannerFilter::feed(const std::string& line) {
  std::vector<std::string> out;
  if (!in_block_) {
    if (is_dash_line(line)) {
      in_block_ = true;
      block_ = {line};
    } else if (!is_end_noise(line)) {
      out.push_back(line);
    }
    return out;
  }
  block_.push_back(line);
  if (!is_dash_line(line)) return out;
  in_block_ = false;
  if (!is_end_banner(block_)) out = std::move(block_);
  block_.clear();
  return out;
}

std::vector<std::string> MpirunBannerFilter::finish() {
  std::vector<std::string> out = std::move(block_);
  block_.clear();
  in_block_ = false;
  return out;
}

}  // namespace launcher
}  // namespace ddp
