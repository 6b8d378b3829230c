// What a Trainer run writes besides checkpoints: progress on rank 0, the metrics file (JSON lines), TensorBoard
// event files, the Chrome trace of each rank, the trained model as ONNX, and the closing lines. One place for
// them, so the epoch loop says what happened and this file says where it goes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/distributed/session.h"
#include "runtime/distributed/world.h"
#include "runtime/io/metrics.h"
#include "runtime/io/tensorboard.h"
#include "runtime/io/trace.h"
#include "runtime/models/module.h"
#include "runtime/training/progress.h"
#include "runtime/training/trainer_options.h"

namespace ddp::training {

// A logged step's figures (rank 0's view; the loss is the mean over ranks).
struct LoggedStep {
  long long step = 0, epoch = 0;
  double loss = 0, lr = 0;
  double samples_per_s = 0, step_ms = 0;
  double comm_hidden = -1;  // share of the all-reduce time hidden under backward; < 0: not measured
  double allreduce_ms = 0, exposed_comm_ms = 0;
  double grad_norm = -1;  // with clipping; < 0: none
};

class RunOutputs {
 public:
  // The trace recorder is made here (DistributedDataParallel records into it); files are opened by open().
  RunOutputs(const TrainerOptions& o, Session& session);
  io::TraceRecorder* trace() const { return trace_.get(); }

  // Checks every output can be written and is none of `inputs` (the data's files), another output or a
  // checkpoint, and opens rank 0's (the metrics file appended to when `resumed`); collective: a problem on any
  // rank ends every rank with one message. The ONNX export of `model` is tried here too, so that a model it
  // cannot express is refused before training, not after.
  void open(const Module& model, const std::vector<std::string>& inputs, bool resumed, long long total_steps,
            long long first_step);

  // Rank 0's first line: the ranks, the device, the backend, the model, the batch, the optimizer, the precision
  // and whether the step is a CUDA graph (else `eager_reason`).
  void first_line(const Module& model, long long steps_per_epoch, const std::string& eager_reason) const;
  void line(const std::string& text) const;  // rank 0: a line below the progress bar
  void step(const LoggedStep& s);
  void evaluation(const EvaluationResult& e, long long step, bool has_test);
  // The end of a run: each rank's trace, and rank 0's ONNX model unless the run was stopped.
  void finish(const Module& model, bool stopped, const Stream& stream);

 private:
  const TrainerOptions& o_;
  Session& session_;
  std::unique_ptr<io::TraceRecorder> trace_;
  std::unique_ptr<io::MetricsWriter> metrics_;          // rank 0's
  std::unique_ptr<io::TensorBoardWriter> tensorboard_;  // rank 0's
  std::unique_ptr<Progress> progress_;                  // rank 0's
};

// Seconds since `t` on the steady clock.
double since(std::chrono::steady_clock::time_point t);

// Where the run's wall time went, printed by rank 0 at the end (the GPU runs ahead of the host, so steps are
// charged when the host next waits for them: at a logged loss, an evaluation or a checkpoint).
struct PhaseTimes {
  double setup_s = 0, train_s = 0, eval_s = 0, checkpoint_s = 0;
  // "time: T s from start: start-up ..., N steps ... (U us each), evaluation ..., checkpoints ...", the total from
  // the process's start as near as a library sees it.
  std::string summary(const WorldStartup& world, long long steps) const;
};

// Rank r's trace file: trace_file itself for rank 0, TRACE.rank<r>.json beside it for the others.
std::string trace_path(const TrainerOptions& o, int rank);

}  // namespace ddp::training
