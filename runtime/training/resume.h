// Where a Trainer run starts: a fresh start, or the newest complete checkpoint of a directory, refused when it
// was written with another recipe (the seed, the optimizer, the loss, the model's architecture, the batch). The
// recipe goes into each checkpoint's metadata under "trainer." keys; checkpoints whose keys are "train_mlp."
// (the example program's, before the trainer was a library) resume too.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "runtime/distributed/session.h"
#include "runtime/io/checkpoint.h"
#include "runtime/models/module.h"
#include "runtime/optim/optimizer.h"
#include "runtime/training/trainer_options.h"

namespace ddp::training {

// Where to resume from. An explicit resume_dir must hold a checkpoint; DDP_RESUME=1 (ddprun --max-restarts
// relaunching a failed job) continues from checkpoint_dir if it holds one, and starts from scratch if the job
// failed before its first checkpoint.
struct ResumeFrom {
  std::string dir;  // empty: a fresh start
  bool required = false;
};
ResumeFrom resume_directory(const TrainerOptions& o);

// The model's architecture as a checkpoint records it: the module tree's types, activations included
// ("Sequential(Linear,ReLU,Linear)" for an MLP too); the sizes are checked by the parameters' shapes when the
// checkpoint loads.
std::string architecture(const Module& model);

// What a checkpoint must have been written with to be resumed by this run, as it goes into its metadata. Both
// batch sizes are written; a resume checks the one this run fixes (the global batch, or the per-rank one), so
// the number of ranks may change.
std::map<std::string, std::string> recipe(const TrainerOptions& o, const Module& model, int ranks);

// Why `checkpoint` cannot continue this run on `ranks` ranks, or "".
std::string recipe_mismatch(const io::CheckpointContents& checkpoint, const TrainerOptions& o, const Module& model,
                            int ranks);

// Why `dir` cannot be resumed from before looking in it (missing, a file), or "".
std::string resume_path_problem(const TrainerOptions& o, const std::string& dir);

// Rank 0's claim on the checkpoint directory, before the first step: the directory is created and locked for
// this job (a second job is refused, naming the first), and a fresh run is refused where another run's
// checkpoints are, since keeping the newest files would then delete this run's own.
std::unique_ptr<io::CheckpointDirectoryLock> claim_checkpoint_dir(const TrainerOptions& o, const ResumeFrom& from);

// Where a run starts: a fresh start, or a checkpoint's step, epoch and global sample position in that epoch.
struct ResumePoint {
  long long step = 0;
  long long epoch = 0;
  long long position = 0;
  bool resumed = false;
};

// Loads the newest complete checkpoint of `from` into the model and the optimizer, on every rank alike, or
// starts from scratch where a restart finds none; anything else that is wrong (no such directory, no complete
// checkpoint where one is required, another recipe) ends every rank with one message. Collective.
ResumePoint resume_run(const ResumeFrom& from, const TrainerOptions& o, Session& session, Module& model,
                       Optimizer& optimizer, std::int64_t dataset_size);

// A checkpoint's recipe value for `key` ("optimizer", ...), under the trainer's prefix or the older one; nullptr
// when the checkpoint does not say.
const std::string* recipe_value(const io::CheckpointMetadata& metadata, const std::string& key);

}  // namespace ddp::training
