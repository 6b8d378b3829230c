// Checkpoint naming, metadata encoding, retention and the newest-complete scan.
#include "runtime/io/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/core/phase.h"
#include "runtime/io/loaded_checkpoint.h"

namespace ddp {
namespace io {
namespace {

constexpr const char* kPrefix = "ckpt-";
constexpr const char* kSuffix = ".safetensors";

std::vector<std::string> directory_entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

void make_directories(const std::string& dir) {
  if (dir.empty()) return;
  struct stat info;
  if (::stat(dir.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) throw InvalidArgument("checkpoint directory " + dir + " exists but is not a directory");
    return;
  }
  const std::string parent = dirname_of(dir);
  if (parent != dir) make_directories(parent);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw InvalidArgument("cannot create checkpoint directory " + dir + ": " + std::strerror(errno));
  }
}

int64_t parse_int(const std::map<std::string, std::string>& m, const std::string& key, const std::string& source) {
  const auto it = m.find(key);
  if (it == m.end()) {
    throw InvalidArgument("checkpoint " + source + ": metadata has no " + key +
                          "; the file is not a checkpoint of this runtime");
  }
  const std::string& v = it->second;
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) {
    throw InvalidArgument("checkpoint " + source + ": metadata " + key + " = '" + v + "' is not an integer");
  }
  return value;
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  DDP_CHECK(step >= 0, "checkpoint step must be non-negative, got " + std::to_string(step));
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08lld", static_cast<long long>(step));
  return std::string(kPrefix) + digits + kSuffix;
}

std::optional<int64_t> parse_checkpoint_file_name(const std::string& name) {
  const size_t p = std::strlen(kPrefix);
  const size_t s = std::strlen(kSuffix);
  if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 || name.compare(name.size() - s, s, kSuffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(p, name.size() - p - s);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::string optimizer_tensor_name(const std::string& state, const std::string& parameter) {
  return std::string(kOptimizerPrefix) + state + "." + parameter;
}

bool is_optimizer_tensor(const std::string& name) { return name.rfind(kOptimizerPrefix, 0) == 0; }

std::map<std::string, std::string> CheckpointMetadata::encode() const {
  std::map<std::string, std::string> m;
  for (const auto& [key, value] : extra) {
    if (key.rfind("ddp.", 0) == 0) {
      throw InvalidArgument("checkpoint metadata key '" + key + "' uses the reserved prefix ddp.");
    }
    m[key] = value;
  }
  m["ddp.format"] = kCheckpointFormat;
  m["ddp.step"] = std::to_string(step);
  m["ddp.epoch"] = std::to_string(epoch);
  m["ddp.sampler_position"] = std::to_string(sampler_position);
  m["ddp.world_size"] = std::to_string(world_size);
  m["ddp.seed"] = std::to_string(seed);
  m["ddp.rng_state"] = rng_state;
  return m;
}

CheckpointMetadata CheckpointMetadata::decode(const std::map<std::string, std::string>& m, const std::string& source) {
  const auto format = m.find("ddp.format");
  if (format == m.end() ||
      (format->second != kCheckpointFormat && format->second != kCheckpointFormatWithoutMetadataChecksum)) {
    throw InvalidArgument("checkpoint " + source + ": metadata ddp.format is " +
                          (format == m.end() ? std::string("missing") : "'" + format->second + "'") +
                          ", expected '" + kCheckpointFormat + "'");
  }

  CheckpointMetadata c;
  c.step = parse_int(m, "ddp.step", source);
  c.epoch = parse_int(m, "ddp.epoch", source);
  c.sampler_position = parse_int(m, "ddp.sampler_position", source);
  const int64_t world_size = parse_int(m, "ddp.world_size", source);
  if (world_size < 1 || world_size > 1000000000) {
    throw InvalidArgument("checkpoint " + source + ": metadata ddp.world_size = " + std::to_string(world_size) +
                          " is not a number of ranks");
  }
  c.world_size = static_cast<int>(world_size);
  const auto seed = m.find("ddp.seed");
  if (seed == m.end()) throw InvalidArgument("checkpoint " + source + ": metadata has no ddp.seed");
  try {
    size_t used = 0;
    c.seed = std::stoull(seed->second, &used);
    if (used != seed->second.size()) throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    throw InvalidArgument("checkpoint " + source + ": metadata ddp.seed = '" + seed->second + "' is not an integer");
  }
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"ddp.step", c.step}, {"ddp.epoch", c.epoch},
                                    {"ddp.sampler_position", c.sampler_position}}) {
    if (value < 0) {
      throw InvalidArgument("checkpoint " + source + ": metadata " + key + " = " + std::to_string(value) +
                            " is negative");
    }
  }
  const auto rng = m.find("ddp.rng_state");
  if (rng != m.end()) c.rng_state = rng->second;
  for (const auto& [key, value] : m) {
    if (key.rfind("ddp.", 0) != 0) c.extra[key] = value;
  }
  return c;
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> files;
  for (const std::string& name : directory_entries(dir)) {
    if (const auto step = parse_checkpoint_file_name(name)) files.push_back({dir + "/" + name, *step});
  }
  std::sort(files.begin(), files.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return files;
}

std::string save_checkpoint(const std::string& dir, const CheckpointMetadata& metadata,
                            const std::vector<TensorSource>& tensors, int keep_last) {
  PhaseGuard phase(Phase::kCheckpoint);
  DDP_CHECK(keep_last >= 0, "keep_last must be non-negative, got " + std::to_string(keep_last));
  make_directories(dir);
  const std::string path = dir + "/" + checkpoint_file_name(metadata.step);
  save_safetensors(path, tensors, metadata.encode());
  prune_checkpoints(dir, keep_last);
  return path;
}

LoadedCheckpoint load_checkpoint(const std::string& path) {
  PhaseGuard phase(Phase::kCheckpoint);
  ReadOptions options;
  options.require_checksums = true;
  options.kind = "checkpoint";
  SafetensorsFile file = load_safetensors(path, options);
  CheckpointMetadata metadata = CheckpointMetadata::decode(file.metadata(), path);
  // The reader verified the metadata's checksum where there is one; from format 2 on there must be one.
  if (file.metadata().at("ddp.format") != kCheckpointFormatWithoutMetadataChecksum &&
      file.metadata().count(kMetadataCrc32Key) == 0) {
    throw InvalidArgument("checkpoint " + path + ": metadata has no checksum (" + kMetadataCrc32Key +
                          "): the file is damaged or was not written by this runtime");
  }
  const auto named_step = parse_checkpoint_file_name(basename_of(path));
  if (named_step && *named_step != metadata.step) {
    throw InvalidArgument("checkpoint " + path + ": metadata says step " + std::to_string(metadata.step) +
                          " but the file name says " + std::to_string(*named_step) + "; the file was renamed");
  }
  return LoadedCheckpoint{path, std::move(metadata), std::move(file)};
}

const CheckpointTensor* CheckpointContents::find(const std::string& name) const {
  for (const CheckpointTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

CheckpointContents LoadedCheckpoint::contents() const {
  CheckpointContents c{path, metadata, {}};
  for (const TensorEntry& t : file.tensors()) c.tensors.push_back(CheckpointTensor{t.name, t.dtype, t.shape});
  return c;
}

void warn_to_stderr(const std::string& message) { std::fprintf(stderr, "ddp: warning: %s\n", message.c_str()); }

std::optional<LoadedCheckpoint> latest_complete_checkpoint(const std::string& dir, const WarningSink& warn,
                                                           const CheckpointCheck& check) {
  const std::vector<CheckpointFile> files = list_checkpoints(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      LoadedCheckpoint loaded = load_checkpoint(it->path);
      const std::string refusal = check ? check(loaded.contents()) : "";
      if (refusal.empty()) return loaded;
      if (warn) warn("skipping checkpoint " + it->path + ": " + refusal);
    } catch (const Error& e) {
      if (warn) warn("skipping checkpoint " + it->path + ": " + e.what());
    }
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& dir, int keep_last) {
  for (const std::string& name : directory_entries(dir)) {
    // Only temporary files of checkpoint writes: another writer's temporary files are not ours to remove.
    if (is_temporary_file(name) && name.rfind(std::string(".") + kPrefix, 0) == 0) {
      ::unlink((dir + "/" + name).c_str());
    }
  }
  if (keep_last <= 0) return;
  const std::vector<CheckpointFile> files = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < files.size(); ++i) ::unlink(files[i].path.c_str());
}

CheckpointDirectoryLock::CheckpointDirectoryLock(const std::string& dir) {
  make_directories(dir);
  const std::string path = dir + "/.lock";
  // The lock is on the directory itself, which cannot be deleted while it holds checkpoints: a lock on the
  // .lock file alone let a second job in once someone deleted the file. The file still names the holder (and
  // is locked too, for jobs of earlier versions).
  dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 || dir_fd_ < 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    if (dir_fd_ >= 0) ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
    throw InvalidArgument("cannot write to checkpoint directory " + dir + ": " + why +
                          "; choose a writable checkpoint directory");
  }
  if (::flock(dir_fd_, LOCK_EX | LOCK_NB) != 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(dir_fd_);
    dir_fd_ = -1;
    std::string holder = read_file(path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    throw InvalidArgument("checkpoint directory " + dir + " is in use by another job (" +
                          (holder.empty() ? std::string("holder unknown") : holder) +
                          "); give this run its own checkpoint directory, or wait for that job to end");
  }
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[64] = "";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + " since " + when + "\n";
  // A directory that takes the lock file but not its contents (a full disk) is found here too.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    ::close(dir_fd_);
    fd_ = dir_fd_ = -1;
    throw InvalidArgument("cannot write to checkpoint directory " + dir + ": " + why +
                          "; choose a writable checkpoint directory");
  }
}

CheckpointDirectoryLock::~CheckpointDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flocks; the file stays, naming the last holder
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

}  // namespace io
}  // namespace ddp
