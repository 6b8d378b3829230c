// Temporary file, fsync, rename, fsync of the directory; cleanup on every failure path.
#include "runtime/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/file_identity.h"

namespace ddp {
namespace io {
namespace {

std::string errno_text() { return std::strerror(errno); }

class TempFile {
 public:
  explicit TempFile(const std::string& path) {
    const std::string dir = dirname_of(path);
    struct stat info;
    if (::stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      throw InvalidArgument("cannot write " + path + ": directory " + dir + " does not exist; create it first");
    }
    std::string pattern = dir + "/." + basename_of(path) + ".tmp-XXXXXX";
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    fd_ = ::mkstemp(name.data());
    if (fd_ < 0) {
      throw InvalidArgument("cannot write " + path + ": creating a temporary file in " + dir + " failed: " +
                            errno_text());
    }
    name_ = name.data();
    // mkstemp makes the file 0600; a checkpoint or metrics file should be readable like any other output.
    ::fchmod(fd_, 0644);
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(name_.c_str());
  }
  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error("writing " + name_ + " failed: " + errno_text());
      }
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }
  void write_at(size_t offset, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error("writing " + name_ + " failed: " + errno_text());
      }
      p += n;
      offset += static_cast<size_t>(n);
      bytes -= static_cast<size_t>(n);
    }
  }
  void commit(const std::string& path) {
    if (::fsync(fd_) != 0) throw Error("fsync of " + name_ + " failed: " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw Error("closing " + name_ + " failed: " + errno_text());
    if (::rename(name_.c_str(), path.c_str()) != 0) {
      throw Error("renaming " + name_ + " to " + path + " failed: " + errno_text());
    }
    committed_ = true;
    // Without this the rename may be lost in a crash even though the data blocks were synced.
    const int dir = ::open(dirname_of(path).c_str(), O_RDONLY | O_DIRECTORY);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }

 private:
  int fd_ = -1;
  std::string name_;
  bool committed_ = false;
};

}  // namespace

std::string dirname_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& write) {
  DDP_CHECK(!path.empty() && path.back() != '/', "write_file_atomically: '" + path + "' is not a file path");
  TempFile temp(path);
  write([&temp](const void* data, size_t bytes) { temp.write(data, bytes); });
  temp.commit(path);
}

void write_file_atomically_rewriting(const std::string& path, const std::function<void(const FileWriter&)>& write) {
  DDP_CHECK(!path.empty() && path.back() != '/', "write_file_atomically: '" + path + "' is not a file path");
  TempFile temp(path);
  const FileWriter writer{[&temp](const void* data, size_t bytes) { temp.write(data, bytes); },
                          [&temp](size_t offset, const void* data, size_t bytes) { temp.write_at(offset, data, bytes); }};
  write(writer);
  temp.commit(path);
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  write_file_atomically(path, [&](const ByteSink& sink) { sink(contents.data(), contents.size()); });
}

void check_can_write_atomically(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    throw InvalidArgument("cannot write " + path + ": it is a directory; give a file name");
  }
  TempFile probe(path);  // removed again when it goes out of scope, never committed
}

bool is_temporary_file(const std::string& file_name) {
  const size_t tmp = file_name.rfind(".tmp-");
  return !file_name.empty() && file_name[0] == '.' && tmp != std::string::npos && tmp > 0 &&
         file_name.size() == tmp + 5 + 6;
}

std::string read_file(const std::string& path) {
  std::string why;
  const RegularFile file = RegularFile::open(path, &why);
  if (!file.is_open()) throw InvalidArgument(path + ": " + why);
  const int fd = file.fd();
  std::string bytes;
  bytes.reserve(static_cast<size_t>(file.size()));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument("reading " + path + " failed: " + errno_text());
    }
    if (n == 0) break;
    bytes.append(chunk, static_cast<size_t>(n));
  }
  return bytes;
}

}  // namespace io
}  // namespace ddp
