// POSIX shell quoting: what ddprun --dry-run prints must paste into a shell as the very command it would run.
#pragma once

#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// `word` as one shell word: unchanged when it holds only safe characters, else in single quotes.
std::string shell_quote(const std::string& word);
// The words quoted and joined by spaces.
std::string shell_join(const std::vector<std::string>& words);

}  // namespace launcher
}  // namespace ddp
