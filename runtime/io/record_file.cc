#include "runtime/io/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/core/check.h"

namespace ddp {
namespace io {

RecordFile::RecordFile(const std::string& path, Mode mode, const std::string& what) : path_(path), what_(what) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK;
  if (mode == Mode::kTruncate) flags |= O_TRUNC;
  if (mode == Mode::kAppend) flags |= O_APPEND;
  if (mode == Mode::kCreateNew) flags |= O_EXCL;
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) {
    const int error = errno;
    throw InvalidArgument("cannot open " + what + " " + path + ": " + std::strerror(error) +
                          (error == EEXIST ? "" : "; check that its directory exists and is writable"));
  }
  const int status = ::fcntl(fd_, F_GETFL);
  if (status >= 0) ::fcntl(fd_, F_SETFL, status & ~O_NONBLOCK);
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool RecordFile::append(const void* data, std::size_t bytes) {
  if (fd_ < 0) return false;
  // Where this record begins: the end of the last whole one (with O_APPEND, the file's end).
  struct stat info;
  const bool known = ::fstat(fd_, &info) == 0;
  const off_t begin = known && S_ISREG(info.st_mode) ? info.st_size : -1;
  const char* p = static_cast<const char*>(data);
  std::size_t left = bytes;
  int error = 0;
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;
      break;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (left == 0) return true;
  // Cut back to the last whole record: on a full disk this frees what the partial write took.
  if (begin >= 0 && ::ftruncate(fd_, begin) == 0) ::lseek(fd_, begin, SEEK_SET);
  failure_ = std::strerror(error);
  ::close(fd_);
  fd_ = -1;
  std::fprintf(stderr,
               "ddp: warning: writing %s %s failed: %s; it keeps the records written before and takes no more in "
               "this run (training and checkpoints go on); free space on its disk or give another path\n",
               what_.c_str(), path_.c_str(), failure_.c_str());
  std::fflush(stderr);
  return false;
}

}  // namespace io
}  // namespace ddp
