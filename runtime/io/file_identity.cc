#include "runtime/io/file_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/io/atomic_file.h"

namespace ddp {
namespace io {

std::string file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

namespace {

std::string not_regular(mode_t mode) {
  return "it is " + file_kind(mode) + ", not a regular file; give the path of a regular file (data and "
         "checkpoints are read from files, never from pipes or devices)";
}

}  // namespace

RegularFile RegularFile::open(const std::string& path, std::string* why) {
  RegularFile file;
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    *why = std::string("cannot open: ") + std::strerror(errno);
    return file;
  }
  if (!S_ISREG(info.st_mode)) {
    *why = not_regular(info.st_mode);
    return file;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("cannot open: ") + std::strerror(errno);
    return file;
  }
  file.fd_ = fd;
  if (::fstat(fd, &info) != 0) {
    *why = std::string("cannot open: ") + std::strerror(errno);
    return RegularFile();
  }
  if (!S_ISREG(info.st_mode)) {
    *why = not_regular(info.st_mode);
    return RegularFile();
  }
  // Regular files ignore O_NONBLOCK for reads; cleared so that nothing later depends on that.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  file.size_ = static_cast<std::uint64_t>(info.st_size);
  return file;
}

RegularFile::RegularFile(RegularFile&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// The file's own identity where it exists; else its parent directory's and its last component's.
struct Identity {
  bool known = false;
  dev_t device = 0;
  ino_t inode = 0;
  std::string name;  // empty when the file itself exists
};

Identity identity_of(const std::string& path) {
  Identity id;
  if (path.empty()) return id;
  struct stat info;
  if (::stat(path.c_str(), &info) == 0) {
    id.known = true;
    id.device = info.st_dev;
    id.inode = info.st_ino;
    return id;
  }
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string name = basename_of(trimmed);
  if (name.empty() || name == "." || name == "..") return id;
  if (::stat(dirname_of(trimmed).c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) return id;
  id.known = true;
  id.device = info.st_dev;
  id.inode = info.st_ino;
  id.name = name;
  return id;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  const Identity x = identity_of(a), y = identity_of(b);
  return x.known && y.known && x.device == y.device && x.inode == y.inode && x.name == y.name;
}

}  // namespace io
}  // namespace ddp
