// Checkpoint directories: names, metadata, retention, and the newest-complete scan skipping damaged files.
#include "runtime/io/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/loaded_checkpoint.h"
#include "tests/scratch.h"

namespace ddp {
namespace io {
namespace {

struct Model {
  std::vector<float> w0 = std::vector<float>(12, 1.5f);
  std::vector<float> b0 = {0.1f, 0.2f, 0.3f};
  std::vector<float> m0 = std::vector<float>(12, -1.0f);
  std::vector<TensorSource> tensors() const {
    return {{"0.weight", DType::kFloat32, {3, 4}, w0.data(), 48},
            {"0.bias", DType::kFloat32, {3}, b0.data(), 12},
            {optimizer_tensor_name("momentum_buffer", "0.weight"), DType::kFloat32, {3, 4}, m0.data(), 48}};
  }
};

CheckpointMetadata meta(int64_t step) {
  CheckpointMetadata m;
  m.step = step;
  m.epoch = step / 10;
  m.sampler_position = 128 * (step % 10);
  m.world_size = 2;
  m.seed = 18446744073709551615ull;
  m.rng_state = "mt19937 1 2 3";
  m.extra = {{"model", "784-256-10"}};
  return m;
}

TEST(Checkpoint, Names) {
  EXPECT_EQ(checkpoint_file_name(100), "ckpt-00000100.safetensors");
  EXPECT_EQ(checkpoint_file_name(123456789), "ckpt-123456789.safetensors");
  EXPECT_EQ(parse_checkpoint_file_name("ckpt-00000100.safetensors"), 100);
  EXPECT_EQ(parse_checkpoint_file_name("ckpt-123456789.safetensors"), 123456789);
  EXPECT_FALSE(parse_checkpoint_file_name(".ckpt-00000100.safetensors.tmp-abcdef"));
  EXPECT_FALSE(parse_checkpoint_file_name("ckpt-.safetensors"));
  EXPECT_FALSE(parse_checkpoint_file_name("ckpt-12a.safetensors"));
  EXPECT_EQ(optimizer_tensor_name("exp_avg", "0.weight"), "optimizer.exp_avg.0.weight");
  EXPECT_TRUE(is_optimizer_tensor("optimizer.exp_avg.0.weight"));
  EXPECT_FALSE(is_optimizer_tensor("0.weight"));
}

TEST(Checkpoint, SaveAndLoadRoundTrip) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-roundtrip") + "/nested/dir";
  Model model;
  const std::string path = save_checkpoint(dir, meta(100), model.tensors());
  EXPECT_EQ(path, dir + "/ckpt-00000100.safetensors");
  const LoadedCheckpoint c = load_checkpoint(path);
  EXPECT_EQ(c.metadata.step, 100);
  EXPECT_EQ(c.metadata.epoch, 10);
  EXPECT_EQ(c.metadata.sampler_position, 0);
  EXPECT_EQ(c.metadata.world_size, 2);
  EXPECT_EQ(c.metadata.seed, 18446744073709551615ull);
  EXPECT_EQ(c.metadata.rng_state, "mt19937 1 2 3");
  EXPECT_EQ(c.metadata.extra.at("model"), "784-256-10");
  EXPECT_EQ(c.file.metadata().at("ddp.format"), kCheckpointFormat);
  std::vector<float> w(12);
  c.file.copy_to("0.weight", DType::kFloat32, {3, 4}, w.data());
  EXPECT_EQ(w, model.w0);
  std::vector<float> wrong(100);
  try {
    c.file.copy_to("0.weight", DType::kFloat32, {3, 8}, wrong.data());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint " + path +
                                         ": tensor 0.weight: shape [3,4] does not match the model's [3,8]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, LatestCompleteSkipsCorruptAndTemporaryFiles) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-latest");
  Model model;
  EXPECT_FALSE(latest_complete_checkpoint(dir));  // no directory yet: no checkpoint
  save_checkpoint(dir, meta(10), model.tensors());
  save_checkpoint(dir, meta(20), model.tensors());
  const std::string newest = save_checkpoint(dir, meta(30), model.tensors());
  // Damage the newest: flip a byte of its data.
  std::string bytes = read_file(newest);
  bytes[bytes.size() - 3] ^= 0x40;
  write_file_atomically(newest, bytes);
  // A write killed midway leaves a temporary file; it must be ignored.
  write_file_atomically(dir + "/.ckpt-00000040.safetensors.tmp-AbCdEf", std::string("half"));
  std::vector<std::string> warnings;
  const auto latest = latest_complete_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->metadata.step, 20);
  EXPECT_EQ(latest->path, dir + "/ckpt-00000020.safetensors");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("skipping checkpoint " + newest), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
}

TEST(Checkpoint, TruncatedAndForeignFilesAreRefused) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-refuse");
  Model model;
  const std::string path = save_checkpoint(dir, meta(5), model.tensors());
  const std::string bytes = read_file(path);
  write_file_atomically(path, bytes.substr(0, bytes.size() - 20));
  try {
    load_checkpoint(path);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint " + path + ": truncated: header says 108 bytes of data, file has 88"),
              std::string::npos)
        << e.what();
  }
  // A safetensors file without our metadata (as PyTorch would write it) is not a resumable checkpoint.
  const std::string foreign = dir + "/ckpt-00000006.safetensors";
  save_safetensors(foreign, model.tensors(), {});
  try {
    load_checkpoint(foreign);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ddp.format is missing"), std::string::npos) << e.what();
  }
  // A renamed file: the step in the name and in the metadata disagree.
  const std::string renamed = dir + "/ckpt-00000007.safetensors";
  save_safetensors(renamed, model.tensors(), meta(3).encode());
  EXPECT_THROW(load_checkpoint(renamed), InvalidArgument);
  EXPECT_FALSE(latest_complete_checkpoint(dir, [](const std::string&) {}));
}

TEST(Checkpoint, KeepsTheLastK) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-keep");
  Model model;
  write_file_atomically(dir + "/.ckpt-00000001.safetensors.tmp-zzzzzz", std::string("x"));
  for (int64_t step = 1; step <= 5; ++step) save_checkpoint(dir, meta(step), model.tensors(), /*keep_last=*/2);
  const auto files = list_checkpoints(dir);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].step, 4);
  EXPECT_EQ(files[1].step, 5);
  struct stat info;
  EXPECT_NE(::stat((dir + "/.ckpt-00000001.safetensors.tmp-zzzzzz").c_str(), &info), 0);
}

TEST(Checkpoint, MetadataValidation) {
  CheckpointMetadata m = meta(1);
  m.extra["ddp.mine"] = "x";
  EXPECT_THROW(m.encode(), InvalidArgument);
  auto encoded = meta(1).encode();
  encoded["ddp.step"] = "12x";
  EXPECT_THROW(CheckpointMetadata::decode(encoded, "f"), InvalidArgument);
  encoded = meta(1).encode();
  encoded.erase("ddp.epoch");
  EXPECT_THROW(CheckpointMetadata::decode(encoded, "f"), InvalidArgument);
  encoded = meta(1).encode();
  encoded["ddp.world_size"] = "0";
  EXPECT_THROW(CheckpointMetadata::decode(encoded, "f"), InvalidArgument);
  encoded = meta(1).encode();
  encoded["ddp.sampler_position"] = "-1";
  try {
    CheckpointMetadata::decode(encoded, "f");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ddp.sampler_position = -1 is negative"), std::string::npos) << e.what();
  }
  EXPECT_EQ(CheckpointMetadata::decode(meta(1).encode(), "f").step, 1);
}


// The text of `path` with `from` (which must occur once) replaced by `to` of the same length.
void patch_file(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_file(path);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  ASSERT_EQ(bytes.find(from, at + 1), std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  write_file_atomically(path, bytes);
}

TEST(Checkpoint, AFlippedMetadataValueFailsItsChecksumAndTheScanFallsBackToThePreviousCheckpoint) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-metadata-crc");
  Model model;
  save_checkpoint(dir, meta(10), model.tensors());
  const std::string newest = save_checkpoint(dir, meta(25), model.tensors());
  // One bit of the epoch: "2" -> "0" (0x32 -> 0x30), the length unchanged.
  patch_file(newest, "\"ddp.epoch\":\"2\"", "\"ddp.epoch\":\"0\"");
  try {
    load_checkpoint(newest);
    FAIL() << "a checkpoint with a damaged epoch was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint " + newest + ": __metadata__: checksum mismatch"),
              std::string::npos)
        << e.what();
  }
  std::vector<std::string> warnings;
  const auto latest = latest_complete_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->metadata.step, 10);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("__metadata__: checksum mismatch"), std::string::npos) << warnings[0];
}

TEST(Checkpoint, ANonNumericMetadataValueIsNamedAndSkipped) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-metadata-text");
  Model model;
  save_checkpoint(dir, meta(10), model.tensors());
  const std::string newest = save_checkpoint(dir, meta(25), model.tensors());
  patch_file(newest, "\"ddp.step\":\"25\"", "\"ddp.step\":\"2x\"");
  std::vector<std::string> warnings;
  const auto latest = latest_complete_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->metadata.step, 10);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].find("stoll"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
}

TEST(Checkpoint, ACheckpointWithoutAMetadataChecksumIsRefusedUnlessItIsOfTheFirstFormat) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-metadata-nocrc");
  Model model;
  const std::string path = save_checkpoint(dir, meta(10), model.tensors());
  // The checksum key renamed to a caller key of the same length: the metadata has no checksum any more.
  patch_file(path, "\"ddp.crc32:__metadata__\"", "\"xxx.crc32:__metadata__\"");
  EXPECT_THROW(load_checkpoint(path), InvalidArgument);
  // A file of format 1 (written before the metadata had a checksum) is still read.
  CheckpointMetadata m = meta(20);
  std::map<std::string, std::string> encoded = m.encode();
  encoded["ddp.format"] = kCheckpointFormatWithoutMetadataChecksum;
  const std::string old = dir + "/ckpt-00000020.safetensors";
  save_safetensors(old, model.tensors(), encoded);
  patch_file(old, "\"ddp.crc32:__metadata__\"", "\"xxx.crc32:__metadata__\"");
  EXPECT_EQ(load_checkpoint(old).metadata.step, 20);
}

TEST(Checkpoint, ACallersCheckSkipsACheckpointAsDamageIs) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-caller-check");
  Model model;
  save_checkpoint(dir, meta(10), model.tensors());
  save_checkpoint(dir, meta(25), model.tensors());  // sampler position 640
  std::vector<std::string> warnings;
  const auto latest = latest_complete_checkpoint(
      dir, [&](const std::string& w) { warnings.push_back(w); },
      [](const CheckpointContents& c) { return c.metadata.sampler_position > 600 ? std::string("past the end") : ""; });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->metadata.step, 10);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("past the end"), std::string::npos) << warnings[0];
}

// What a check sees: the file's path, its metadata, and every tensor's name, type and shape, as written.
TEST(Checkpoint, ACheckSeesTheFilesTensorsByNameTypeAndShape) {
  const std::string dir = ddp::testing::fresh_scratch_dir("ckpt-contents");
  Model model;
  const std::string path = save_checkpoint(dir, meta(10), model.tensors());
  std::vector<std::string> seen;
  latest_complete_checkpoint(dir, nullptr, [&](const CheckpointContents& c) {
    EXPECT_EQ(c.path, path);
    EXPECT_EQ(c.metadata.step, 10);
    for (const TensorSource& t : model.tensors()) {
      const CheckpointTensor* found = c.find(t.name);
      EXPECT_NE(found, nullptr) << t.name;
      if (found != nullptr) {
        EXPECT_EQ(found->dtype, t.dtype) << t.name;
        EXPECT_EQ(found->shape, t.shape) << t.name;
      }
    }
    EXPECT_EQ(c.find("no such tensor"), nullptr);
    for (const CheckpointTensor& t : c.tensors) seen.push_back(t.name);
    return std::string();
  });
  EXPECT_EQ(seen.size(), model.tensors().size());
}

TEST(CheckpointDirectoryLock, ASecondJobIsRefusedNamingTheFirstUntilItEnds) {
  const std::string dir = ddp::testing::fresh_scratch_dir("lock") + "/deeper";
  {
    CheckpointDirectoryLock first(dir);  // creates the directories
    try {
      CheckpointDirectoryLock second(dir);  // flock is per open file: a second one in the same process conflicts
      FAIL() << "two jobs locked one checkpoint directory";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is in use by another job (pid " + std::to_string(::getpid()) + " on "), std::string::npos)
          << what;
      EXPECT_NE(what.find("its own checkpoint directory"), std::string::npos) << what;
    }
  }
  CheckpointDirectoryLock again(dir);  // released with the first
  EXPECT_TRUE(list_checkpoints(dir).empty());  // the lock file is no checkpoint
}

TEST(CheckpointDirectoryLock, DeletingTheLockFileDoesNotLetASecondJobIn) {
  const std::string dir = ddp::testing::fresh_scratch_dir("lock-deleted");
  CheckpointDirectoryLock first(dir);
  ASSERT_EQ(::unlink((dir + "/.lock").c_str()), 0);
  EXPECT_THROW(CheckpointDirectoryLock second(dir), InvalidArgument);
}

TEST(CheckpointDirectoryLock, AnUnwritableDirectoryIsRefusedByName) {
  const std::string dir = ddp::testing::fresh_scratch_dir("lock-file");
  CheckpointDirectoryLock ok(dir);
  write_file_atomically(dir + "/plain", std::string("x"));
  try {
    CheckpointDirectoryLock under_a_file(dir + "/plain");
    FAIL() << "locked a directory that is a file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/plain"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CheckpointDirectoryLock("/proc/ddp-checkpoints"), InvalidArgument);
}

}  // namespace
}  // namespace io
}  // namespace ddp
