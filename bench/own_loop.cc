// The main job's recipe (784-512-512-10, batch 128, AdamW, warmup and cosine, 30 epochs of Fashion-MNIST) as a
// loop of one's own on ddp::TrainStep over the training set held on the device: what bench/fit_vs_train_mlp.sh
// times against the Trainer's step on the same model. Prints "N steps S s (U us each)" as the Trainer's time line
// does, then the test accuracy.
//   mpirun -np 1 bazel-bin/bench/own_loop [DATA_DIR [MAX_STEPS]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ddp.h"
#include "runtime/data/evaluation_shard.h"
#include "runtime/data/idx.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/training/train_step.h"

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::Session session(&argc, &argv);
    using namespace ddp::data;
    const char* dir = argc > 1 ? argv[1] : kDefaultFashionMnistDir;
    const long max_steps = argc > 2 ? std::atol(argv[2]) : 0;
    const Dataset train = load_fashion_mnist(dir, Split::kTrain);
    const std::int64_t batch = 128;
    const int epochs = 30;
    DistributedSampler sampler({.dataset_size = train.size, .num_replicas = session.size(), .rank = session.rank()});
    ResidentDataset data(view(train), session.device());
    ddp::MLP model({784, 512, 512, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device());
    ddp::DistributedDataParallel ddp_model(model, session);
    ddp::AdamW optimizer(model, {.lr = 2e-3, .weight_decay = 0.05});
    const std::int64_t per_epoch = sampler.batches_per_epoch(batch);
    ddp::CosineWithWarmup schedule(2e-3, per_epoch / 2, per_epoch * epochs);
    ddp::TrainStep step(session, optimizer, [&](const ddp::Tensor& x, const ddp::Tensor& y) {
      ddp::Tensor loss = ddp::ops::cross_entropy(model.forward(x), y);
      ddp_model.backward(loss);
      return loss;
    });
    step.use_source(data, batch, train.feature_count);
    const long total = max_steps > 0 ? max_steps : static_cast<long>(per_epoch * epochs);
    step.plan(schedule, total);
    const auto start = std::chrono::steady_clock::now();
    long steps = 0;
    std::vector<std::int64_t> rows;
    for (int epoch = 0; epoch < epochs && steps < total; ++epoch) {
      sampler.set_epoch(epoch);
      data.start_epoch(sampler, session.stream());
      while (steps < total && sampler.next_batch(batch, &rows)) {
        schedule.apply(optimizer);
        step.next(static_cast<std::int64_t>(rows.size()), /*read_loss=*/steps + 1 == total);
        ++steps;
      }
    }
    session.stream().synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const EvaluationShard test(load_fashion_mnist(dir, Split::kTest), session.rank(), session.size(),
                               session.device());
    ddp::autograd::NoGradGuard no_grad;
    double correct = 0;
    for (const DeviceBatch& chunk : test.chunks())
      correct += ddp::ops::count_correct(model.forward(chunk.features), chunk.labels).item();
    const double accuracy = session.sum(correct) / session.sum(test.rows());
    if (session.is_lead()) {
      std::printf("own_loop: %ld steps %.2f s (%.1f us each), CUDA graph %s\n", steps, seconds, seconds * 1e6 / steps,
                  step.captured() ? "on" : ("off: " + step.eager_reason()).c_str());
      std::printf("final step=%ld test_accuracy=%.4f\n", steps, accuracy);
    }
    return 0;
  });
}
