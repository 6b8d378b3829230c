// A Trainer run's evaluation: the loss over the whole test set (accuracy for the built-in cross-entropy, each metric
// of one's own), a forward per chunk of this rank's shard with the sums kept on the device, read back once, then
// summed over the ranks.
#pragma once

#include "runtime/data/evaluation_shard.h"
#include "runtime/distributed/session.h"
#include "runtime/training/precision_model.h"
#include "runtime/training/trainer_options.h"

namespace ddp::training {

// Collective. The model is in eval mode meanwhile and back in training mode after.
EvaluationResult evaluate(const TrainerOptions& o, Session& session, const PrecisionModel& model,
                          const data::EvaluationShard& test);

}  // namespace ddp::training
