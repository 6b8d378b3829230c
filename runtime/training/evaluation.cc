// The evaluation of a run (see evaluation.h).
#include "runtime/training/evaluation.h"

#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/phase.h"
#include "runtime/ops/ops.h"

namespace ddp::training {

EvaluationResult evaluate(const TrainerOptions& o, Session& session, const PrecisionModel& model,
                          const data::EvaluationShard& test) {
  PhaseGuard evaluating(Phase::kEvaluation);  // what a hang report says of a rank stuck here
  autograd::NoGradGuard no_grad;
  const Stream& stream = session.stream();
  model.model().eval();
  const bool classes = !o.loss_function && o.loss == Loss::kCrossEntropy;
  // Per chunk, on the device: its mean loss, its correct count (classes), each metric's mean.
  std::vector<std::vector<Tensor>> parts;
  for (const data::DeviceBatch& c : test.chunks()) {
    std::vector<Tensor>& part = parts.emplace_back();
    const Tensor out = model.forward(c.features, stream, DType::kFloat32);
    if (o.loss_function) {
      part.push_back(o.loss_function(out, c.labels));
    } else if (classes) {
      part.push_back(ops::cross_entropy(out, c.labels, stream));
    } else {
      part.push_back(ops::mse_loss(out, c.labels, stream));
    }
    part.push_back(classes ? ops::count_correct(out, c.labels, stream) : Tensor());
    for (const Metric& metric : o.metrics) part.push_back(metric.value(out, c.labels));
  }
  // loss * n, correct, n, then each metric * n; the first read waits for them all.
  std::vector<double> sums(3 + o.metrics.size(), 0.0);
  sums[2] = static_cast<double>(test.rows());
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const auto rows = static_cast<double>(test.chunks()[k].labels.size(0));
    sums[0] += parts[k][0].item(stream) * rows;
    if (classes) sums[1] += parts[k][1].item(stream);
    for (std::size_t m = 0; m < o.metrics.size(); ++m) sums[3 + m] += parts[k][2 + m].item(stream) * rows;
  }
  sums = session.sum(sums);
  model.model().train();
  EvaluationResult result{.loss = sums[0] / sums[2], .accuracy = classes ? sums[1] / sums[2] : -1.0};
  for (std::size_t m = 0; m < o.metrics.size(); ++m) {
    result.metrics.emplace_back(o.metrics[m].name, sums[3 + m] / sums[2]);
  }
  return result;
}

}  // namespace ddp::training
