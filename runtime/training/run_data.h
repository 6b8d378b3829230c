// The data of a Trainer run: the training set where it trains (on the device, or in the host's memory for a set
// larger than the device), each rank's DistributedSampler over it, the test set's shard of each rank, and the
// check, before anything is copied, that the data and the model fit each other and the loss.
#pragma once

#include <memory>
#include <string>

#include "runtime/data/batch_source.h"
#include "runtime/data/evaluation_shard.h"
#include "runtime/data/idx.h"
#include "runtime/data/sampler.h"
#include "runtime/distributed/session.h"
#include "runtime/models/module.h"
#include "runtime/training/trainer_options.h"

namespace ddp::training {

struct RunData {
  data::SamplerOptions sampler_options;
  std::unique_ptr<data::DistributedSampler> sampler;
  long long steps_per_epoch = 0;
  std::unique_ptr<data::BatchSource> train;
  std::unique_ptr<data::EvaluationShard> test;  // null without a test set
};

// Checks the data against `model` and the options on every rank (one message for all when they do not fit),
// then copies it where it trains. Collective.
RunData load_run_data(const TrainerOptions& o, Session& session, Module& model, const data::Dataset& train_set,
                      const data::Dataset& test_set);

// Why the data sets cannot train `model` with `o`'s loss, or "". A model other than an MLP is asked for its output
// on one training sample (in eval mode, without recording) to learn its widths, and a loss of one's own for its
// loss on it.
std::string data_problem(const TrainerOptions& o, Module& model, const data::Dataset& train_set,
                         const data::Dataset& test_set, const Device& device, const Stream& stream);

}  // namespace ddp::training
