// Atomic file replacement: a reader (or a resumed job) sees the old file or the whole new one, never half.
//
// The bytes go to a temporary file in the destination's directory (so rename stays within one file system),
// which is fsynced, renamed over the destination, and the directory fsynced so the rename itself survives a
// power cut. If writing fails (an exception from the caller's writer, a full disk) the temporary file is removed
// and the destination is untouched. A process killed mid-write leaves only a temporary file, whose name
// (".NAME.tmp-XXXXXX") is_temporary_file recognises so directory scans can skip and clean it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace ddp {
namespace io {

// Appends bytes to the file being written; throws ddp::Error on a failed write.
using ByteSink = std::function<void(const void* data, size_t bytes)>;

// A file being written: bytes appended in order, and bytes already appended replaced in place (a header whose
// contents, such as checksums, are known only once the data after it has been written).
struct FileWriter {
  ByteSink append;
  std::function<void(size_t offset, const void* data, size_t bytes)> overwrite;
};

// Calls `write` with a sink into a temporary file, then atomically replaces `path` with it. Throws
// ddp::InvalidArgument naming the path when the directory is missing or not writable, ddp::Error on an I/O
// failure; rethrows whatever `write` throws. In every failure case `path` keeps its old contents.
void write_file_atomically(const std::string& path, const std::function<void(const ByteSink&)>& write);
void write_file_atomically(const std::string& path, const std::string& contents);
// The same with a writer that can also replace bytes it has written.
void write_file_atomically_rewriting(const std::string& path, const std::function<void(const FileWriter&)>& write);

// Throws what write_file_atomically(path, ...) would throw before writing anything (a missing or read-only
// directory, a path that is a directory), by creating and removing a temporary file beside `path`. For checking
// output paths when a run starts rather than when it ends.
void check_can_write_atomically(const std::string& path);

// True for names made by write_file_atomically's temporary files (a base name, not a path).
bool is_temporary_file(const std::string& file_name);

// Reads a whole regular file (RegularFile::open, file_identity.h); throws InvalidArgument naming it when it is not
// one or cannot be opened or read.
std::string read_file(const std::string& path);

// Directory and base name of a path ("a/b/c" -> "a/b", "c"; "c" -> ".", "c").
std::string dirname_of(const std::string& path);
std::string basename_of(const std::string& path);

}  // namespace io
}  // namespace ddp
