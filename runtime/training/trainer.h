// Trainer: a whole training run as a library object, so that a program gets the runtime's speed and safety from
// a model (any Module), data, a recipe and a few lines:
//
//   ddp::Session session(&argc, &argv);
//   ddp::MLP model({784, 512, 512, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device(), session.stream());
//   ddp::Trainer trainer(session, model, {.batch_size = 128, .epochs = 30, .checkpoint_dir = "runs/a"});
//   return trainer.fit(train_set, test_set);      // 0, or ddp::kStoppedExitStatus after a graceful stop
//
// What fit() does:
// - the data sets go to the training device once (ResidentDataset, EvaluationShard; HostBatches for a set larger
//   than the device); each rank takes its DistributedSampler shard, resumable mid-epoch;
// - the model goes under DistributedDataParallel (ZeRO-1 with shard_optimizer), the optimizer is made after it,
//   in FP32, TF32 or bf16 with FP32 master weights (bf16: an MLP or a Sequential of Linear and activations);
// - each step is a TrainStep (train_step.h): eager for a few steps, then on a GPU over NCCL one CUDA graph of
//   forward, loss, backward with its all-reduces, the update and the next batch's gather; the schedule,
//   clipping and the non-finite policy;
// - checkpoints (resume.h: resume at any world size, a checkpoint of another recipe refused), the graceful stop
//   on SIGTERM, SIGINT or SIGUSR1 after the same step on every rank;
// - an evaluation after every epoch (the loss, accuracy for the built-in cross-entropy, metrics of one's own),
//   and the outputs of run_outputs.h; hooks after each step and each evaluation.
//
// Everything is collective: every rank makes the same calls with the same options. Errors end every rank with
// one message (run_main prints it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/core/activation.h"
#include "runtime/data/idx.h"
#include "runtime/distributed/session.h"
#include "runtime/models/module.h"
#include "runtime/training/trainer_options.h"

namespace ddp {

class Trainer {
 public:
  // `model` (any Module: an MLP, a Sequential, a module of one's own) must outlive the trainer; its parameters
  // are broadcast from rank 0 when fit() starts.
  Trainer(Session& session, Module& model, TrainerOptions options, TrainerHooks hooks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on `train` (and evaluates on `test` after every epoch when it has rows) until the epochs or
  // max_steps are done or a graceful stop; returns 0, or kStoppedExitStatus after a stop (its checkpoint
  // written). Both data sets are copied to the device; they may go away afterwards. Collective.
  int fit(const data::Dataset& train, const data::Dataset& test);

  // The last evaluation (after fit).
  const EvaluationResult& last_evaluation() const;
  // Optimizer steps taken (across resumes).
  std::int64_t step() const;

 private:
  class Run;
  Session& session_;
  Module& model_;
  TrainerOptions options_;
  TrainerHooks hooks_;
  std::unique_ptr<Run> run_;
};

// The first step on a GPU loads every kernel it launches (CUDA loads them lazily) and makes cuBLASLt's plan
// for every GEMM shape: a good part of the start-up. A program that reads its data on another thread calls this
// meanwhile: one step of a throwaway MLP of these sizes, precision and optimizer on zeros. What stays is what
// the run reuses: the loaded kernels, the GEMM plans and the allocator's cache. Does nothing on the CPU.
void warm_up_device(const Session& session, const std::vector<std::int64_t>& sizes, Activation activation,
                    const TrainerOptions& options);

}  // namespace ddp
