#include "launcher/child_process.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ddp {
namespace launcher {

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

[[noreturn]] void exec_or_exit(const std::vector<std::string>& argv, const char* prefix,
                               const char* not_found_hint) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  const int error = errno;
  write_all(STDERR_FILENO, std::string(prefix) + "cannot run " + args[0] + ": " + std::strerror(error) +
                               (error == ENOENT ? not_found_hint : "") + "\n");
  ::_exit(127);
}

std::string private_directory(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + ".XXXXXX";
  return ::mkdtemp(path.data()) != nullptr ? path : "";
}

}  // namespace launcher
}  // namespace ddp
