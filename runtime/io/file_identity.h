// What a path names, asked of the file system rather than read from the string. Readers open only regular files
// (a FIFO given as data would block its open for ever; a device's open can have effects), and outputs are
// compared with inputs by device and inode, so that "out/./m.jsonl", "out/m.jsonl" and a link to it are one file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ddp {
namespace io {

// A regular file open for reading (close-on-exec, blocking reads), closed when this goes away.
class RegularFile {
 public:
  // Opens `path` only if it names a regular file (symbolic links followed): stat first, so that nothing else is
  // opened, then open with O_NONBLOCK (a FIFO put there meanwhile opens at once instead of blocking) and fstat the
  // descriptor, so that what is read is what was checked. On failure returns a file that is not open and sets
  // `*why`: "cannot open: No such file or directory", "it is a FIFO (named pipe), not a regular file; ...".
  static RegularFile open(const std::string& path, std::string* why);

  RegularFile() = default;
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// "a FIFO (named pipe)", "a directory", "a character device", ... for a stat st_mode.
std::string file_kind(mode_t mode);

// Whether `a` and `b` name the same file: the same device and inode where both exist; where one does not exist
// yet, the same parent directory (device and inode) and the same last component, so that an output about to be
// created is recognised too ("out/./m.jsonl" against "out/m.jsonl"). A path whose parent directory does not exist
// names no file, and so never the same one as another path.
bool same_file(const std::string& a, const std::string& b);

}  // namespace io
}  // namespace ddp
