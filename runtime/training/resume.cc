// Resume and the recipe check (see resume.h).
#include "runtime/training/resume.h"

#include <sys/stat.h>

#include <cstdio>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/io/atomic_file.h"  // dirname_of, basename_of
#include "runtime/models/layers.h"
#include "runtime/training/training_checkpoint.h"

namespace ddp::training {
namespace {

constexpr const char* kRecipePrefix = "trainer.";
constexpr const char* kOlderRecipePrefix = "train_mlp.";

std::string optimizer_name(const TrainerOptions& o) {
  return std::holds_alternative<SgdOptions>(o.optimizer) ? "sgd" : "adamw";
}

// The same directory, however it is written ("runs/a", "./runs/a/").
bool same_directory(const std::string& a, const std::string& b) {
  struct stat x, y;
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

}  // namespace

ResumeFrom resume_directory(const TrainerOptions& o) {
  if (!o.resume_dir.empty()) return {o.resume_dir, true};
  if (o.resume_if_restarted && !o.checkpoint_dir.empty() && settings::flag(settings::setting("DDP_RESUME"))) {
    return {o.checkpoint_dir, false};
  }
  return {};
}

std::string architecture(const Module& model) {
  // An MLP is a Sequential by another name: its checkpoint continues in the same Sequential written out.
  std::string out = dynamic_cast<const Sequential*>(&model) != nullptr ? "Sequential" : model.type_name();
  if (model.children().empty()) return out;
  out += "(";
  for (std::size_t i = 0; i < model.children().size(); ++i) {
    out += (i > 0 ? "," : "") + architecture(*model.children()[i].second);
  }
  return out + ")";
}

std::map<std::string, std::string> recipe(const TrainerOptions& o, const Module& model, int ranks) {
  const std::string p = kRecipePrefix;
  std::map<std::string, std::string> out = {
      {p + "optimizer", optimizer_name(o)},
      {p + "loss", o.loss_function ? o.loss_function_name : loss_name(o.loss)},
      {p + "architecture", architecture(model)},
      {p + "batch_size", std::to_string(o.batch_size)},
      {p + "global_batch_size", std::to_string(o.batch_size * ranks)}};
  if (const auto* mlp = dynamic_cast<const MLP*>(&model)) out[p + "activation"] = activation_name(mlp->activation());
  return out;
}

const std::string* recipe_value(const io::CheckpointMetadata& metadata, const std::string& key) {
  for (const char* prefix : {kRecipePrefix, kOlderRecipePrefix}) {
    const auto it = metadata.extra.find(prefix + key);
    if (it != metadata.extra.end()) return &it->second;
  }
  return nullptr;
}

namespace {

// Whether the checkpoint holds a parameter of every name and shape the model has: then the architecture key
// decides (layers without parameters, activations, differ); otherwise loading names the first tensor that differs,
// which says more than two architectures side by side.
bool same_parameters(const io::CheckpointContents& checkpoint, const Module& model) {
  const NamedTensors parameters = model.named_parameters();
  for (const auto& [name, tensor] : parameters) {
    const io::CheckpointTensor* entry = checkpoint.find(name);
    if (entry == nullptr || entry->shape != tensor.shape()) return false;
  }
  // And no more of them: everything else in the file is the optimizer's state or a module's buffer.
  std::size_t model_tensors = 0;
  for (const io::CheckpointTensor& entry : checkpoint.tensors) {
    if (entry.name.rfind("optimizer.", 0) != 0 && entry.name.rfind("buffer.", 0) != 0) ++model_tensors;
  }
  return model_tensors == parameters.size();
}

}  // namespace

std::string recipe_mismatch(const io::CheckpointContents& checkpoint, const TrainerOptions& o, const Module& model,
                            int ranks) {
  const auto& m = checkpoint.metadata;
  const std::string seed = option_text(o, "seed");
  if (m.seed != o.seed) {
    return checkpoint.path + " was written with " + seed + " " + std::to_string(m.seed) + ", this run has " + seed +
           " " + std::to_string(o.seed);
  }
  const std::string p = kRecipePrefix;
  const std::string unchecked = o.global_batch_size > 0 ? "batch_size" : "global_batch_size";
  for (const auto& [full_key, value] : recipe(o, model, ranks)) {
    const std::string key = full_key.substr(p.size());
    const std::string* written = recipe_value(m, key);
    if (key == unchecked || written == nullptr || *written == value) continue;  // older checkpoints do not say
    if (key == "architecture") {
      if (!same_parameters(checkpoint, model)) continue;
      return checkpoint.path + " was written by a model " + *written + ", this run's model is " + value +
             " (the same parameters, other layers); resume with the same model, or start a new run in another " +
             option_text(o, "checkpoint_dir");
    }
    const std::string name = option_text(o, key);
    std::string message = checkpoint.path + " was written with " + name + " " + *written + ", this run has " + name +
                          " " + value + "; resume with the same " + name;
    const std::string* global = recipe_value(m, "global_batch_size");
    if (key == "batch_size" && global != nullptr) {
      message += " (or " + option_text(o, "global_batch_size", *global) +
                 " to keep its global batch on any number of ranks)";
    }
    return message + ", or start a new run in another " + option_text(o, "checkpoint_dir");
  }
  return "";
}

std::string resume_path_problem(const TrainerOptions& o, const std::string& dir) {
  struct stat info;
  const std::string resume = option_text(o, "resume_dir", dir);
  if (::stat(dir.c_str(), &info) != 0) return resume + ": no such directory";
  if (!S_ISDIR(info.st_mode)) {
    return resume + " is a file; pass the directory that holds the checkpoints (" + io::dirname_of(dir) + ")";
  }
  return "";
}

std::unique_ptr<io::CheckpointDirectoryLock> claim_checkpoint_dir(const TrainerOptions& o, const ResumeFrom& from) {
  auto lock = std::make_unique<io::CheckpointDirectoryLock>(o.checkpoint_dir);
  const std::vector<io::CheckpointFile> existing = io::list_checkpoints(o.checkpoint_dir);
  const bool continuing_it = !from.dir.empty() && same_directory(from.dir, o.checkpoint_dir);
  if (!existing.empty() && !continuing_it) {
    throw InvalidArgument(option_text(o, "checkpoint_dir", o.checkpoint_dir) +
                          " already holds another run's checkpoints (newest: " + io::basename_of(existing.back().path) +
                          "); to continue that run use " + option_text(o, "resume_dir", o.checkpoint_dir) +
                          ", to start over remove them or choose another " + option_text(o, "checkpoint_dir"));
  }
  return lock;
}

ResumePoint resume_run(const ResumeFrom& from, const TrainerOptions& o, Session& session, Module& model,
                       Optimizer& optimizer, std::int64_t dataset_size) {
  if (from.dir.empty()) return {};
  session.agree(from.required ? resume_path_problem(o, from.dir) : "", "cannot resume", AgreedError::kInput);
  const auto restored = restore_latest_training_checkpoint(
      session, from.dir, model, optimizer,
      [&](const io::CheckpointContents& checkpoint) { return recipe_mismatch(checkpoint, o, model, session.size()); },
      dataset_size);
  session.agree(!restored && from.required ? "no complete checkpoint in " + from.dir : "", "cannot resume",
                AgreedError::kInput);
  if (!restored) {
    if (session.is_lead()) {
      std::printf("no complete checkpoint in %s yet (%s): starting from scratch\n", from.dir.c_str(),
                  settings::resume_reason().c_str());
    }
    return {};
  }
  const io::CheckpointMetadata& m = restored->metadata;
  // Any number of ranks continues at the saved global position (the sampler lays the rest of the epoch out
  // over this run's ranks).
  const ResumePoint point{m.step, m.epoch, m.sampler_position, true};
  if (session.is_lead()) {
    std::printf("resumed from %s: step %lld, epoch %lld, sample %lld", restored->path.c_str(), point.step,
                point.epoch, point.position);
    if (m.world_size != session.size()) {
      const std::string* global = recipe_value(m, "global_batch_size");
      std::printf(" (written on %d ranks, continuing on %d; global batch %s -> %lld)", m.world_size,
                  session.size(), global != nullptr ? global->c_str() : "?",
                  static_cast<long long>(o.batch_size * session.size()));
    }
    std::printf("\n");
  }
  return point;
}

}  // namespace ddp::training
