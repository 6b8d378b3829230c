// mpirun's output as ddprun passes it on: mpirun tags each rank's output ("[1,3]<stderr>:text"), interleaves
// the ranks' pieces of a line, and adds banners of its own about a job's end. This file turns that stream
// back into whole lines, each of one rank, and drops the banners ddprun says in a line of its own.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {
namespace launcher {

// One line of mpirun --tag-output output: "[1,3]<stderr>:text" becomes rank 3, stream "stderr", text "text".
struct TaggedLine {
  bool tagged = false;
  int rank = -1;
  std::string stream;  // "stdout", "stderr" or "stddiag"
  std::string text;    // the whole line when untagged
};
TaggedLine parse_tagged_line(const std::string& line);
// "[1,3]<stdout>:text" -> "[rank 3] text"; untagged lines are returned unchanged.
std::string rewrite_tagged_line(const std::string& line);

// mpirun's tagged output (--tag-output) as whole lines, each of one rank and stream. mpirun tags what a rank
// writes as it reads it, so a line a rank writes in pieces ("part-one ", then "part-two\n") reaches the pipe in
// pieces, each tagged, with other ranks' pieces in between:
//   [1,1]<stdout>:part-one [1,0]<stdout>:part-one [1,1]<stdout>:part-two\n[1,0]<stdout>:part-two\n
// Fed the bytes of one of mpirun's pipes as they come, this keeps a line under way per rank and stream and
// returns each line once it is whole, with its tag ("[1,1]<stdout>:part-one part-two"); mpirun's own untagged
// lines come back as they are. A carriage return in a rank's line ends a redraw (a progress bar drawn in place:
// "[1,0]<stdout>:[###...] step 5\r"): returned at once with its '\r' and without a newline (is_redraw), so that
// the bar moves as the rank draws it; "\r\n" is an ordinary line end.
class TaggedLineJoiner {
 public:
  // A line the joiner returned that is a redraw: it ends with '\r' and is written without a newline.
  static bool is_redraw(const std::string& line) { return !line.empty() && line.back() == '\r'; }
  // The lines that `bytes` completes, in the order they were completed.
  std::vector<std::string> feed(const std::string& bytes);
  // At the end of the stream: what is left, lines without their newline.
  std::vector<std::string> finish();

 private:
  // The line under way of `tag`, begun empty when there is none.
  std::string& line_of(const std::string& tag);
  // Moves the line under way of `tag` to `lines`.
  void emit_tagged(const std::string& tag, std::vector<std::string>* lines);
  // Takes the text at pending_[at] up to the next stop (a newline, a carriage return, a '[' that may start a
  // tag) into the line under way; returns where the next piece starts. `*wait`: a carriage return at the very
  // end of the bytes so far, which the next byte tells apart from "\r\n".
  size_t take_text(size_t at, std::vector<std::string>* lines, bool* wait);
  size_t take_redraw(size_t at, size_t carriage_return, std::vector<std::string>* lines, bool* wait);
  void append_piece(const std::string& piece, bool ends_line, std::vector<std::string>* lines);

  std::string pending_;         // bytes not yet taken apart (the start of what may be a tag)
  std::string current_tag_;     // the tag whose piece runs on, or "" between pieces
  std::string untagged_;        // an untagged line under way
  std::vector<std::pair<std::string, std::string>> partial_;  // (tag, the line so far), in order of first piece
};

// mpirun's own banners about a job's end, which ddprun says in one line of its own (the rank that failed first
// and how): "MPI_ABORT was invoked on rank R", "Primary job terminated normally, but 1 process returned a
// non-zero exit code", "mpirun detected that one or more processes exited with non-zero status", "mpirun
// noticed that process rank R ... exited on signal", "... exiting improperly", each a block between lines of
// dashes, and the lines around them (ORTE_ERROR_LOG, "N more processes have sent help message", "Set MCA
// parameter orte_base_help_aggregate"). Fed mpirun's untagged lines in order, it returns those to print: a
// block is held until it closes, then dropped when it is one of these and returned whole otherwise (mpirun's
// other messages, such as a program it cannot start, say what to fix). The FailureTracker still sees every line.
class MpirunBannerFilter {
 public:
  std::vector<std::string> feed(const std::string& untagged_line);
  // At the end of the stream: a block never closed, whole.
  std::vector<std::string> finish();

 private:
  bool in_block_ = false;
  std::vector<std::string> block_;
};

}  // namespace launcher
}  // namespace ddp
