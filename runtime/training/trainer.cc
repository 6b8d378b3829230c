// The trainer (see trainer.h): set-up, the epochs with their steps, evaluation and the end of a run. The step
// itself is a TrainStep, the data a RunData, the outputs a RunOutputs, the recipe check resume.h's.
#include "runtime/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/phase.h"
#include "runtime/core/stop_request.h"
#include "runtime/distributed/distributed_data_parallel.h"
#include "runtime/distributed/reducer.h"
#include "runtime/distributed/world.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/training/evaluation.h"
#include "runtime/training/fault_injection.h"
#include "runtime/training/precision_model.h"
#include "runtime/training/resume.h"
#include "runtime/training/run_data.h"
#include "runtime/training/run_outputs.h"
#include "runtime/training/train_step.h"
#include "runtime/training/training_checkpoint.h"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;
using training::since;

// The loss of the model's output for x against y: one's own, or a built-in one (float32 outputs for mse).
Tensor loss_of(const TrainerOptions& o, const training::PrecisionModel& model, const Tensor& x, const Tensor& y,
               const Stream& stream) {
  if (o.loss_function) return o.loss_function(model.forward(x, stream, DType::kFloat32), y);
  if (o.loss == Loss::kMse) return ops::mse_loss(model.forward(x, stream, DType::kFloat32), y, stream);
  return ops::cross_entropy(model.forward(x, stream), y, stream);
}

// The optimizer step count at the end of the run (without max_steps): the checkpoint's, then the batches left
// in its epoch at this run's ranks and batch, then whole epochs. Equal to steps_per_epoch * epochs unless the
// run resumed at another global batch (or skipped steps).
long long steps_at_end(const data::SamplerOptions& so, const training::ResumePoint& start, const TrainerOptions& o,
                       long long steps_per_epoch) {
  if (start.epoch >= o.epochs) return start.step;
  data::DistributedSampler rest(so);
  rest.set_epoch(start.epoch);
  rest.set_global_position(start.position);
  return start.step + rest.batches_per_epoch(o.batch_size) + (o.epochs - start.epoch - 1) * steps_per_epoch;
}

}  // namespace

class Trainer::Run {
 public:
  Run(const TrainerOptions& o, Session& session, Module& model, const TrainerHooks& hooks)
      : o_(o), session_(session), model_(model), hooks_(hooks), outputs_(o, session) {}

  void load_data(const data::Dataset& train_set, const data::Dataset& test_set) {
    data_ = training::load_run_data(o_, session_, model_, train_set, test_set);
    inputs_ = train_set.files;
    inputs_.insert(inputs_.end(), test_set.files.begin(), test_set.files.end());
    features_ = train_set.feature_count;
  }

  // The model in the run's precision under DistributedDataParallel, its optimizer and schedule, and the step.
  void build_model() {
    precision_ = std::make_unique<training::PrecisionModel>(model_, o_.precision);
    ddp_ = std::make_unique<DistributedDataParallel>(
        model_, session_,
        DdpOptions{.bucket_cap_mb = o_.bucket_mb, .trace = outputs_.trace(), .shard_optimizer = o_.shard_optimizer});
    optimizer_ = make_optimizer(o_, model_, stream_);
    precision_->attach(*optimizer_, stream_);
    const long long steps_per_epoch = data_.steps_per_epoch;
    if (o_.schedule == LrScheduleKind::kCosine) {
      schedule_ = std::make_unique<CosineWithWarmup>(
          optimizer_lr(o_), static_cast<std::int64_t>(o_.warmup_epochs * steps_per_epoch), steps_per_epoch * o_.epochs, 0.0);
    } else {
      schedule_ = std::make_unique<ConstantLr>(optimizer_lr(o_));
    }
    TrainStepOptions step_options{
        .cuda_graph = o_.cuda_graph,
        .clip_grad_norm = o_.clip_grad_norm,
        .skip_nonfinite = o_.skip_nonfinite,
        .skip_nonfinite_limit = o_.skip_nonfinite_limit,
        .eager_if_capture_fails = true,
        .option_name = [this](const std::string& option, const std::string& value) {
          return option_text(o_, option, value);
        },
        .say = [this](const std::string& line) { outputs_.line(line); }};
    step_ = std::make_unique<TrainStep>(
        session_, *optimizer_,
        [this](const Tensor& x, const Tensor& y) {
          Tensor loss = loss_of(o_, *precision_, x, y, stream_);
          ddp_->backward(loss);
          return loss;
        },
        std::move(step_options));
    step_->use_source(*data_.train, o_.batch_size, features_);
    if (!o_.trace_file.empty()) step_->run_eagerly(option_text(o_, "trace_file") + " times every backward on the host");
  }

  // The checkpoint directory and resume, then the outputs, all checked before the first step; the run's first line.
  void open_outputs_and_resume() {
    const training::ResumeFrom from = training::resume_directory(o_);
    std::string error;
    try {
      if (session_.is_lead() && !o_.checkpoint_dir.empty()) checkpoint_lock_ = training::claim_checkpoint_dir(o_, from);
    } catch (const std::exception& e) {
      error = e.what();
    }
    session_.agree(error, "cannot use the checkpoint directory");
    start_ = training::resume_run(from, o_, session_, model_, *optimizer_, data_.sampler_options.dataset_size);
    if (start_.resumed) precision_->refresh(stream_);
    step_count_ = start_.step;
    total_steps_ = steps_at_end(data_.sampler_options, start_, o_, data_.steps_per_epoch);
    if (o_.max_steps > 0) total_steps_ = std::min<long long>(total_steps_, o_.max_steps);
    done_ = step_count_ >= total_steps_;
    outputs_.open(model_, inputs_, start_.resumed, total_steps_, step_count_);
    outputs_.first_line(model_, data_.steps_per_epoch, step_->eager_reason());
    if (total_steps_ > step_count_) step_->plan(*schedule_, total_steps_ - step_count_);
  }

  // Every epoch from the resume point to the end (or max_steps), each followed by an evaluation.
  void train() {
    const auto train_start = Clock::now();
    window_start_ = Clock::now();
    bool evaluated = false;
    data::DistributedSampler& sampler = *data_.sampler;
    for (long long epoch = start_.epoch; epoch < o_.epochs && !done_; ++epoch) {
      const long long position = run_epoch(epoch);
      const bool epoch_finished = sampler.epoch_finished();
      if (stopped_) {  // no evaluation: the time until the job is killed is short
        if (last_saved_step_ != step_count_) save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
        break;
      }
      // The next epoch's order is drawn while the device still runs this one's queued steps, not after.
      if (!done_ && epoch + 1 < o_.epochs) sampler.set_epoch(epoch + 1);
      // The host runs up to an epoch ahead of the device: wait here, so the time line charges the queued steps
      // to training and not to the evaluation that would otherwise wait for them (one wait per epoch).
      stream_.synchronize();
      const auto boundary_start = Clock::now();
      evaluate_epoch(epoch, epoch_finished);
      evaluated = true;
      if (done_) {
        // Mid-epoch, a checkpoint of this step may already be there (checkpoint_every): the same file again.
        if (last_saved_step_ != step_count_ || epoch_finished)
          save(epoch_finished ? epoch + 1 : epoch, epoch_finished ? 0 : position);
      } else if (epoch + 1 == o_.epochs) {
        save(epoch + 1, 0);
      }
      // The progress window goes on across the boundary without the evaluation and the checkpoint: its samples
      // since the last line were trained before them, so its clock skips them rather than restarting.
      window_start_ += Clock::now() - boundary_start;
    }
    if (!evaluated && !stopped_) last_eval_ = evaluate();
    times_.train_s = since(train_start) - times_.eval_s - times_.checkpoint_s;
  }

  // The exit status: 0, or kStoppedExitStatus after a graceful stop.
  int finish() {
    outputs_.finish(model_, stopped_, stream_);
    if (session_.is_lead()) std::printf("%s\n", times_.summary(session_.world().startup(), step_count_ - start_.step).c_str());
    if (stopped_) {
      // The signal and its time as the rank that received it saw them (the others only heard of it).
      const double waited = session_.max(seconds_since_stop_request());
      const int sig = static_cast<int>(session_.max(stop_signal()));
      if (session_.is_lead()) {
        const char* name = sig > 0 ? ::sigabbrev_np(sig) : nullptr;
        std::printf("%s: stopped at step %lld on %s%s (%.1f s after the request); %s\n", o_.name.c_str(), step_count_,
                    name != nullptr ? "SIG" : "", name != nullptr ? name : "request", waited,
                    o_.checkpoint_dir.empty()
                        ? ("no " + option_text(o_, "checkpoint_dir") + ", nothing saved").c_str()
                        : ("resume with " + option_text(o_, "resume_dir", o_.checkpoint_dir)).c_str());
        std::fflush(stdout);
      }
      return kStoppedExitStatus;
    }
    if (session_.is_lead()) {
      std::printf("final step=%lld", step_count_);
      if (data_.test) std::printf(" test_loss=%.4f", last_eval_.loss);
      if (data_.test && last_eval_.accuracy >= 0) std::printf(" test_accuracy=%.4f", last_eval_.accuracy);
      std::printf("\n");
      std::fflush(stdout);
    }
    return 0;
  }

  void add_setup_time(double seconds) { times_.setup_s += seconds; }
  const EvaluationResult& last_evaluation() const { return last_eval_; }
  long long step() const { return step_count_; }

 private:
  // One pass over the sampler's batches of `epoch` from where it stands; returns the global sample position
  // reached (the end of the epoch, or where max_steps stopped it).
  long long run_epoch(long long epoch) {
    data::DistributedSampler& sampler = *data_.sampler;
    sampler.set_epoch(epoch);
    sampler.set_global_position(epoch == start_.epoch ? start_.position : 0);
    data_.train->start_epoch(sampler, stream_);
    long long position = sampler.global_position();
    while (sampler.next_batch(o_.batch_size, &rows_)) {
      const auto n = static_cast<std::int64_t>(rows_.size());
      position = sampler.global_position();
      schedule_->apply(*optimizer_);
      const bool log = (step_count_ + 1) % o_.log_every == 0 || step_count_ + 1 == total_steps_;
      const StepResult result = step_->next(n, log);
      if (!result.taken) continue;  // skipped: the next backward overwrites the gradients
      ++step_count_;
      training::maybe_inject_fault(step_count_, session_.rank());
      window_samples_ += n * session_.size();
      ++window_steps_;
      if (log) log_step(epoch, result);
      if (hooks_.on_step_end) {
        hooks_.on_step_end(StepEnd{
            .step = step_count_, .epoch = epoch, .logged = log, .loss = result.mean_loss, .lr = optimizer_->lr()});
      }
      if (o_.checkpoint_every > 0 && step_count_ % o_.checkpoint_every == 0) save(epoch, position);
      if (step_count_ >= total_steps_) {
        done_ = true;
        break;
      }
      // A graceful stop: every rank sees the same answer after the same step.
      if (session_.stop_requested()) {
        stopped_ = done_ = true;
        break;
      }
    }
    return position;
  }

  void log_step(long long epoch, const StepResult& result) {
    const double seconds = std::chrono::duration<double>(Clock::now() - window_start_).count();
    const ReducerStats& stats = ddp_->last_stats();  // of the last eager step: a replay has no timings
    training::LoggedStep s{.step = step_count_, .epoch = epoch, .loss = result.mean_loss, .lr = optimizer_->lr()};
    s.samples_per_s = window_samples_ / std::max(seconds, 1e-9);
    s.step_ms = window_steps_ > 0 ? seconds * 1e3 / window_steps_ : 0.0;
    if (!result.replayed && stats.timed && session_.size() > 1) {
      s.comm_hidden =
          stats.allreduce_ms > 0 ? std::clamp(1.0 - stats.exposed_comm_ms / stats.allreduce_ms, 0.0, 1.0) : 1.0;
      s.allreduce_ms = stats.allreduce_ms;
      s.exposed_comm_ms = stats.exposed_comm_ms;
    }
    if (o_.clip_grad_norm > 0) s.grad_norm = result.grad_norm;
    outputs_.step(s);
    window_start_ = Clock::now();
    window_samples_ = 0;
    window_steps_ = 0;
  }

  EvaluationResult evaluate() const {
    if (!data_.test) return EvaluationResult{.loss = NAN, .accuracy = -1};
    return training::evaluate(o_, session_, *precision_, *data_.test);
  }

  void evaluate_epoch(long long epoch, bool epoch_finished) {
    const auto eval_start = Clock::now();
    last_eval_ = evaluate();
    last_eval_.epoch = epoch;
    last_eval_.epoch_finished = epoch_finished;
    times_.eval_s += since(eval_start);
    if (hooks_.on_evaluation) hooks_.on_evaluation(last_eval_);
    outputs_.evaluation(last_eval_, step_count_, data_.test != nullptr);
  }

  void save(long long epoch, long long position) {
    if (o_.checkpoint_dir.empty()) return;
    const auto save_start = Clock::now();
    io::CheckpointMetadata m;
    m.step = step_count_;
    m.epoch = epoch;
    m.sampler_position = position;
    // No rng_state: the data order is drawn from (seed, epoch), both of which the checkpoint holds; a Dropout's
    // draw count is one of the model's buffers.
    m.seed = o_.seed;
    m.extra = training::recipe(o_, model_, session_.size());
    const std::string path =
        training::save_training_checkpoint(session_, o_.checkpoint_dir, model_, *optimizer_, m, o_.keep_checkpoints);
    outputs_.line("checkpoint=" + path + " step=" + std::to_string(step_count_));
    last_saved_step_ = step_count_;
    times_.checkpoint_s += since(save_start);
  }

  const TrainerOptions& o_;
  Session& session_;
  Module& model_;
  const TrainerHooks& hooks_;
  const Stream& stream_ = session_.stream();
  training::RunOutputs outputs_;
  training::PhaseTimes times_;
  training::RunData data_;
  std::int64_t features_ = 0;
  std::vector<std::string> inputs_;  // the data's files, which no output may be
  std::vector<std::int64_t> rows_;
  std::unique_ptr<training::PrecisionModel> precision_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<TrainStep> step_;
  std::unique_ptr<io::CheckpointDirectoryLock> checkpoint_lock_;
  training::ResumePoint start_;
  long long step_count_ = 0, total_steps_ = 0;
  bool done_ = false;     // max_steps reached (perhaps by the run resumed), or stopped
  bool stopped_ = false;  // a graceful stop (SIGTERM, SIGINT, SIGUSR1 to any rank or to ddprun)
  long long last_saved_step_ = -1;
  EvaluationResult last_eval_;
  Clock::time_point window_start_;
  long long window_samples_ = 0;
  long long window_steps_ = 0;
};

Trainer::Trainer(Session& session, Module& model, TrainerOptions options, TrainerHooks hooks)
    : session_(session), model_(model), options_(std::move(options)), hooks_(std::move(hooks)) {
  std::string error;
  try {
    if (options_.global_batch_size > 0) {
      options_.batch_size = data::per_replica_batch_size(options_.global_batch_size, session_.size());
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  session_.agree(error, "bad batch size", AgreedError::kInput);
}

Trainer::~Trainer() = default;

int Trainer::fit(const data::Dataset& train, const data::Dataset& test) {
  const auto setup_start = Clock::now();
  run_ = std::make_unique<Run>(options_, session_, model_, hooks_);
  run_->load_data(train, test);
  run_->build_model();
  run_->open_outputs_and_resume();
  run_->add_setup_time(since(setup_start));
  run_->train();
  return run_->finish();
}

const EvaluationResult& Trainer::last_evaluation() const {
  if (run_ == nullptr) throw InvalidArgument("Trainer::last_evaluation: call fit() first");
  return run_->last_evaluation();
}

std::int64_t Trainer::step() const { return run_ ? run_->step() : 0; }

}  // namespace ddp
