// The run's outputs (see run_outputs.h).
#include "runtime/training/run_outputs.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/file_identity.h"
#include "runtime/models/layers.h"
#include "runtime/training/onnx_export.h"

namespace ddp::training {
namespace {

// The process's start, as near as a library can see it: the time line of a run counts from here.
const std::chrono::steady_clock::time_point kProcessStart = std::chrono::steady_clock::now();

// Seconds since the epoch, as the metrics' "time" (what TensorBoard and plots put on a wall-clock axis).
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Why one of this rank's outputs would overwrite another, one of `inputs` (the data's files) or a checkpoint, or
// "": files compared by identity (io::same_file), so that "out/./m.jsonl", "out/m.jsonl" and a link are one file.
std::string output_problem(const TrainerOptions& o, int rank, const std::vector<std::string>& inputs) {
  std::vector<std::pair<std::string, std::string>> outputs;  // (option, path)
  if (!o.metrics_file.empty()) outputs.emplace_back("metrics_file", o.metrics_file);
  if (!o.trace_file.empty()) outputs.emplace_back("trace_file", trace_path(o, rank));
  if (!o.onnx_file.empty()) outputs.emplace_back("onnx_file", o.onnx_file);
  for (std::size_t a = 0; a < outputs.size(); ++a) {
    const auto& [option, path] = outputs[a];
    for (std::size_t b = a + 1; b < outputs.size(); ++b) {
      if (io::same_file(path, outputs[b].second)) {
        return option_text(o, option) + " and " + option_text(o, outputs[b].first) + " name the same file " + path +
               "; give each its own";
      }
    }
    for (const std::string& input : inputs) {
      if (io::same_file(path, input)) {
        return option_text(o, option, path) + " is the data file " + input +
               ", which the run would overwrite; give the output another path";
      }
    }
    const std::string name = io::basename_of(path);
    for (const std::string* dir : {&o.checkpoint_dir, &o.resume_dir}) {
      if (dir->empty() || !io::same_file(io::dirname_of(path), *dir)) continue;
      if (io::parse_checkpoint_file_name(name) || name == ".lock") {
        return option_text(o, option, path) + " is a checkpoint directory's own file, which the run would " +
               "overwrite; give the output another path";
      }
    }
  }
  return "";
}

}  // namespace

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string PhaseTimes::summary(const WorldStartup& world, long long steps) const {
  char text[480];
  const double total = since(kProcessStart);
  const double world_s = world.mpi_s + world.device_s + world.nccl_s;
  std::snprintf(text, sizeof text,
                "time: %.2f s from start: start-up %.2f s (MPI, device and NCCL %.2f = %.2f + %.2f + %.2f, "
                "data, model and DDP %.2f), %lld steps %.2f s (%.0f us each), evaluation %.2f s, checkpoints %.2f s",
                total, total - train_s - eval_s - checkpoint_s, world_s, world.mpi_s, world.device_s, world.nccl_s,
                setup_s, steps, train_s, steps > 0 ? train_s * 1e6 / steps : 0.0, eval_s, checkpoint_s);
  return text;
}

std::string trace_path(const TrainerOptions& o, int rank) {
  return rank == 0 ? o.trace_file : o.trace_file + ".rank" + std::to_string(rank) + ".json";
}

RunOutputs::RunOutputs(const TrainerOptions& o, Session& session) : o_(o), session_(session) {
  if (!o_.trace_file.empty()) trace_ = std::make_unique<io::TraceRecorder>(session_.rank());
}

void RunOutputs::open(const Module& model, const std::vector<std::string>& inputs, bool resumed,
                      long long total_steps, long long first_step) {
  std::string error;
  try {
    error = output_problem(o_, session_.rank(), inputs);
    if (error.empty()) {
      if (session_.is_lead() && !o_.metrics_file.empty()) {
        metrics_ = std::make_unique<io::MetricsWriter>(o_.metrics_file, resumed);
      }
      if (!o_.trace_file.empty()) io::check_can_write_atomically(trace_path(o_, session_.rank()));
      if (!o_.onnx_file.empty()) io::check_can_write_atomically(o_.onnx_file);
      if (session_.is_lead() && !o_.tensorboard_dir.empty()) {
        // A resumed run writes a file of its own beside the stopped one's, which may carry the same second in
        // its name (a restart at once); TensorBoard reads every events file of the directory.
        tensorboard_ = std::make_unique<io::TensorBoardWriter>(
            o_.tensorboard_dir, resumed ? ".resumed-at-step-" + std::to_string(first_step) : "");
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  session_.agree(error, "cannot write the run's outputs");
  error = "";
  try {
    if (session_.is_lead() && !o_.onnx_file.empty()) (void)onnx_model_bytes(model, session_.stream());
  } catch (const std::exception& e) {
    error = option_text(o_, "onnx_file", o_.onnx_file) + ": " + e.what();
  }
  session_.agree(error, "cannot export the model as ONNX");
  if (session_.is_lead()) progress_ = std::make_unique<Progress>(total_steps, first_step);
}

void RunOutputs::first_line(const Module& network, long long steps_per_epoch,
                            const std::string& eager_reason) const {
  if (!session_.is_lead()) return;
  std::string model = network.type_name();
  if (const auto* mlp = dynamic_cast<const MLP*>(&network)) {
    for (std::size_t i = 0; i < mlp->sizes().size(); ++i)
      model += (i ? "-" : " ") + std::to_string(mlp->sizes()[i]);
  } else {
    model += " (" + std::to_string(network.num_parameters()) + " parameters)";
  }
  std::printf("%s: %d rank(s) on %s, backend %s, %s, batch %lld per rank (%lld global), %lld steps per epoch, "
              "%s lr %g, %s",
              o_.name.c_str(), session_.size(), session_.device().str().c_str(),
              backend_name(session_.backend()).c_str(), model.c_str(), static_cast<long long>(o_.batch_size),
              static_cast<long long>(o_.batch_size * session_.size()), steps_per_epoch,
              std::holds_alternative<SgdOptions>(o_.optimizer) ? "sgd" : "adamw", optimizer_lr(o_),
              precision_name(o_.precision).c_str());
  if (o_.shard_optimizer) std::printf(", optimizer state sharded over %d rank(s)", session_.size());
  if (session_.device().is_cuda()) {
    const std::string& off = eager_reason;
    std::printf(", CUDA graph %s", off.empty() ? "on" : ("off: " + off).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void RunOutputs::line(const std::string& text) const {
  if (!session_.is_lead()) return;
  if (progress_) {
    progress_->line(text);
  } else {
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
}

void RunOutputs::step(const LoggedStep& s) {
  if (!session_.is_lead()) return;
  progress_->step(s.step, s.epoch, s.loss, s.samples_per_s, s.comm_hidden);
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> values = {{"train/loss", s.loss},
                                                          {"train/lr", s.lr},
                                                          {"train/samples_per_s", s.samples_per_s},
                                                          {"train/step_ms", s.step_ms}};
    if (s.comm_hidden >= 0) {
      values.emplace_back("train/comm_hidden", s.comm_hidden);
      values.emplace_back("train/exposed_comm_ms", s.exposed_comm_ms);
    }
    if (s.grad_norm >= 0) values.emplace_back("train/grad_norm", s.grad_norm);
    tensorboard_->scalars(values, s.step);
  }
  if (metrics_) {
    nlohmann::json line = {{"step", s.step},
                           {"epoch", s.epoch},
                           {"loss", s.loss},
                           {"samples_per_s", s.samples_per_s},
                           {"step_ms", s.step_ms},
                           {"time", wall_time()}};
    if (s.comm_hidden >= 0) {  // the last eager step's all-reduce time, and the part of it backward did not hide
      line["comm_hidden"] = s.comm_hidden;
      line["allreduce_ms"] = s.allreduce_ms;
      line["exposed_comm_ms"] = s.exposed_comm_ms;
    }
    line["lr"] = s.lr;
    if (s.grad_norm >= 0) line["grad_norm"] = s.grad_norm;  // before clipping
    metrics_->write(line);
  }
}

void RunOutputs::evaluation(const EvaluationResult& e, long long step, bool has_test) {
  if (!session_.is_lead() || !has_test) return;
  char text[160];
  std::snprintf(text, sizeof text, "epoch=%lld%s test_loss=%.4f", static_cast<long long>(e.epoch),
                e.epoch_finished ? "" : " (partial)", e.loss);
  std::string shown = text;
  if (e.accuracy >= 0) {
    std::snprintf(text, sizeof text, " test_accuracy=%.4f", e.accuracy);
    shown += text;
  }
  for (const auto& [name, value] : e.metrics) {
    std::snprintf(text, sizeof text, "=%.4f", value);
    shown += " test_" + name + text;
  }
  line(shown);
  if (metrics_) {
    nlohmann::json record = {{"epoch", e.epoch}, {"test_loss", e.loss}, {"time", wall_time()}};
    if (e.accuracy >= 0) record["test_accuracy"] = e.accuracy;
    for (const auto& [name, value] : e.metrics) record["test_" + name] = value;
    metrics_->write(record);
  }
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> values = {{"test/loss", e.loss}};
    if (e.accuracy >= 0) values.emplace_back("test/accuracy", e.accuracy);
    for (const auto& [name, value] : e.metrics) values.emplace_back("test/" + name, value);
    tensorboard_->scalars(values, step);
  }
}

void RunOutputs::finish(const Module& model, bool stopped, const Stream& stream) {
  // Every rank writes its own track; rank r's file is TRACE.rank<r>.json beside rank 0's TRACE.
  if (trace_) trace_->write(trace_path(o_, session_.rank()));
  if (stopped || o_.onnx_file.empty()) return;
  std::string error;
  try {
    if (session_.is_lead()) export_onnx(model, o_.onnx_file, stream);
  } catch (const std::exception& e) {
    error = e.what();
  }
  session_.agree(error, "cannot write the ONNX model");
  line("onnx=" + o_.onnx_file);
}

}  // namespace ddp::training
