// The data of a run (see run_data.h).
#include "runtime/training/run_data.h"

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/data/host_batches.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/models/layers.h"
#include "runtime/training/precision_model.h"

namespace ddp::training {
namespace {

// Whether the training set stays in the host's memory (TrainerOptions::data_placement); every rank alike.
bool train_from_host(const TrainerOptions& o, const Session& session, const data::Dataset& train_set) {
  if (o.data_placement != DataPlacement::kAuto) return o.data_placement == DataPlacement::kHost;
  if (!session.device().is_cuda()) return false;
  const data::DatasetView v = data::view(train_set);
  const double bytes = static_cast<double>(v.size) * (static_cast<double>(v.feature_count) * 4.0 +
                                                      static_cast<double>(v.y_row_bytes()));
  return session.any(bytes > 0.5 * static_cast<double>(cuda_free_memory(session.device())));
}

// The first sample of `d` as a batch of one on `device`.
std::pair<Tensor, Tensor> first_sample(const data::Dataset& d, const Device& device, const Stream& stream) {
  const std::vector<float> x(d.features.begin(), d.features.begin() + d.feature_count);
  Tensor features = Tensor::from_vector(x, {1, d.feature_count}, device, stream);
  if (d.regression()) {
    const std::vector<float> y(d.targets.begin(), d.targets.begin() + d.target_width);
    return {features, Tensor::from_vector(y, {1, d.target_width}, device, stream)};
  }
  return {features, Tensor::from_int32({d.labels[0]}, {1}, device, stream)};
}

// The model's input and output widths: an MLP's sizes, or what its output on one training sample shows ("" and
// the widths), or why it cannot take the samples.
std::string model_widths(const TrainerOptions& o, Module& model, const data::Dataset& train_set,
                         const Device& device, const Stream& stream, std::int64_t* in, std::int64_t* out) {
  if (const auto* mlp = dynamic_cast<const MLP*>(&model)) {
    *in = mlp->sizes().front();
    *out = mlp->sizes().back();
    return "";
  }
  const bool training = model.is_training();
  autograd::NoGradGuard no_grad;
  model.eval();
  std::string problem;
  try {
    const auto [x, y] = first_sample(train_set, device, stream);
    const Tensor output = model.forward(x, stream);
    *in = train_set.feature_count;
    *out = output.dim() == 2 ? output.size(1) : -1;
    if (*out < 0) problem = "the model's output for a batch must be [batch, outputs]; it is " + output.describe();
    if (problem.empty() && o.loss_function) {
      const Tensor loss = o.loss_function(output, y);
      if (!loss.defined() || loss.numel() != 1 || loss.dtype() != DType::kFloat32) {
        problem = option_text(o, "loss_function") + " must return the batch's mean loss, a float32 tensor of one " +
                  "element; for one sample it returned " +
                  (loss.defined() ? loss.describe() : std::string("an undefined tensor"));
      }
    }
  } catch (const std::exception& e) {
    problem = "the model cannot take the training set's samples of " + std::to_string(train_set.feature_count) +
              " features: " + e.what();
  }
  model.train(training);
  return problem;
}

// Why `d` (the training or the test set) does not fit a model of these widths and the loss, or "".
std::string set_problem(const TrainerOptions& o, const data::Dataset& d, const data::Dataset& train_set,
                        std::int64_t in, std::int64_t out) {
  const std::string which = &d == &train_set ? "training" : "test";
  if (d.feature_count != in) {
    // A test set unlike the training set is the data's fault, not the model's.
    const bool test_unlike_train = &d != &train_set && train_set.feature_count == in;
    return "the " + which + " set has " + std::to_string(d.feature_count) + " features per sample, the model's " +
           "input has " + std::to_string(in) +
           (test_unlike_train ? " as the training set has; give a test set of the training set's features"
                              : "; make the model's first size " + std::to_string(d.feature_count));
  }
  if (d.regression() != train_set.regression() || d.target_width != train_set.target_width) {
    return "the test set's targets are not of the training set's kind or width";
  }
  if (o.loss_function) return "";  // a loss of one's own takes whatever targets it was written for
  if (o.loss == Loss::kMse && !d.regression()) {
    return "the loss is mse but the " + which + " set has class labels; use the cross-entropy loss, or float targets";
  }
  if (o.loss == Loss::kCrossEntropy && d.regression()) {
    return "the loss is cross-entropy but the " + which + " set has float targets; use the mse loss, or integer " +
           "class labels";
  }
  if (d.regression() && d.target_width != out) {
    return "the " + which + " set's targets have width " + std::to_string(d.target_width) + ", the model's " +
           "output has " + std::to_string(out) + " units; make the model's last size " +
           std::to_string(d.target_width);
  }
  if (!d.regression() && d.num_classes > out) {
    return "the " + which + " set has " + std::to_string(d.num_classes) + " classes, the model's output has " +
           std::to_string(out) + " units; make the model's last size " + std::to_string(d.num_classes);
  }
  return "";
}

}  // namespace

std::string data_problem(const TrainerOptions& o, Module& model, const data::Dataset& train_set,
                         const data::Dataset& test_set, const Device& device, const Stream& stream) {
  if (train_set.size <= 0) return "the training set is empty";
  std::string problem = precision_problem(model, o.precision);
  if (!problem.empty()) return problem;
  std::int64_t in = 0, out = 0;
  problem = model_widths(o, model, train_set, device, stream, &in, &out);
  if (!problem.empty()) return problem;
  for (const data::Dataset* d : {&train_set, &test_set}) {
    if (d->size == 0) continue;
    problem = set_problem(o, *d, train_set, in, out);
    if (!problem.empty()) return problem;
  }
  return "";
}

RunData load_run_data(const TrainerOptions& o, Session& session, Module& model, const data::Dataset& train_set,
                      const data::Dataset& test_set) {
  const Stream& stream = session.stream();
  std::string problem;
  try {
    problem = data_problem(o, model, train_set, test_set, session.device(), stream);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  session.agree(problem, "the data does not fit the model", AgreedError::kInput);
  RunData d;
  d.sampler_options = data::SamplerOptions{
      .dataset_size = train_set.size, .num_replicas = session.size(), .rank = session.rank(), .seed = o.seed};
  d.sampler = std::make_unique<data::DistributedSampler>(d.sampler_options);
  std::string error;
  try {
    d.sampler->check_batch_size(o.batch_size);
  } catch (const std::exception& e) {
    error = e.what();
  }
  session.agree(error, "bad batch size", AgreedError::kInput);
  d.steps_per_epoch = d.sampler->batches_per_epoch(o.batch_size);
  if (train_from_host(o, session, train_set)) {
    d.train = std::make_unique<data::HostBatches>(data::view(train_set), d.sampler_options, o.batch_size,
                                                  session.device(), stream);
  } else {
    d.train = std::make_unique<data::ResidentDataset>(data::view(train_set), session.device(), stream);
  }
  if (test_set.size > 0) {
    d.test = std::make_unique<data::EvaluationShard>(test_set, session.rank(), session.size(), session.device(),
                                                     stream);
  }
  return d;
}

}  // namespace ddp::training
