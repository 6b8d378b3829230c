// The smallest complete program on the runtime: an MLP trained on Fashion-MNIST for one epoch across ranks, its
// step a loop of its own on ddp::TrainStep (a CUDA graph on a GPU), the training set held on the device.
//   ddprun -np 2 -- bazel-bin/examples/minimal     (docs/api.md shows it; tests/examples/minimal_test.sh runs it)
#include <cstdio>

#include "ddp.h"
#include "runtime/data/evaluation_shard.h"
#include "runtime/data/idx.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/training/train_step.h"

int main(int argc, char** argv) {
  return ddp::run_main([&] {                     // an error on any rank ends every rank with one message
    ddp::Session session(&argc, &argv);          // MPI, rank, GPU, stream (every call's default), backend
    using namespace ddp::data;
    const Dataset train = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain);
    DistributedSampler sampler({.dataset_size = train.size, .num_replicas = session.size(), .rank = session.rank()});
    ResidentDataset data(view(train), session.device());   // the training set copied to the device once
    ddp::MLP model({784, 256, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device());
    ddp::DistributedDataParallel ddp_model(model, session);  // broadcasts rank 0's weights, averages gradients
    ddp::AdamW optimizer(model, {.lr = 1e-3});
    ddp::TrainStep step(session, optimizer, [&](const ddp::Tensor& x, const ddp::Tensor& y) {
      ddp::Tensor loss = ddp::ops::cross_entropy(model.forward(x), y);
      ddp_model.backward(loss);                  // all-reduces gradient buckets while backward runs
      return loss;                               // the step zeroes the gradients before, updates after
    });
    step.use_source(data, /*batch_rows=*/64, train.feature_count);
    data.start_epoch(sampler, session.stream());
    std::vector<std::int64_t> rows;
    for (int n = 1; sampler.next_batch(64, &rows); ++n) {
      const ddp::StepResult r = step.next(rows.size(), /*read_loss=*/n % 100 == 0);  // mean over ranks
      if (r.loss_read && session.is_lead()) std::printf("step %d loss %.4f\n", n, r.mean_loss);
    }
    const EvaluationShard test(load_fashion_mnist(kDefaultFashionMnistDir, Split::kTest), session.rank(),
                               session.size(), session.device());
    ddp::autograd::NoGradGuard no_grad;
    double correct = 0;
    for (const DeviceBatch& chunk : test.chunks())
      correct += ddp::ops::count_correct(model.forward(chunk.features), chunk.labels).item();
    const double accuracy = session.sum(correct) / session.sum(test.rows());
    if (session.is_lead()) std::printf("test accuracy %.4f\n", accuracy);
    return accuracy > 0.8 ? 0 : 1;
  });
}
