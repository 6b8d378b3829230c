// What every process ddprun forks shares: the exec that says why it failed, as a shell does, writes that
// survive EINTR, and a private directory for a child's files.
#pragma once

#include <string>
#include <vector>

namespace ddp {
namespace launcher {

// Writes all of `text` to `fd`, again after EINTR; gives up silently on another error.
void write_all(int fd, const std::string& text);

// The end of every forked child here: exec `argv`, or say why not ("<prefix>cannot run PROGRAM: why", and
// `not_found_hint` when there is no such program) and exit 127, as a shell does.
[[noreturn]] void exec_or_exit(const std::vector<std::string>& argv, const char* prefix,
                               const char* not_found_hint = "");

// A new directory of this user's under TMPDIR (or /tmp) named `prefix`.XXXXXX, or "" when none can be made
// (the caller then does without).
std::string private_directory(const std::string& prefix);

}  // namespace launcher
}  // namespace ddp
