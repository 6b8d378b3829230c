// A regression of one's own on the library's Trainer: a residual network (each block x + GELU(Linear(LayerNorm(x))))
// trained on .npy data with the Trainer's speed (data on the device, the step as one CUDA graph) and safety.
//
//   ddprun -np 2 -- bazel-bin/examples/residual_regression DATA_DIR [TEST_DIR [EPOCHS [WIDTH [BLOCKS [BATCH]]]]]
//
// DATA_DIR holds features.npy [n, in] and targets.npy [n, out] (float32). tests/examples/residual_regression_test.sh
// trains it on a known function to the test loss the README states.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "ddp.h"
#include "runtime/data/array_file.h"
#include "runtime/training/trainer.h"

namespace {

// in -> width, `blocks` residual blocks of `width`, -> out; every Linear its own range of the seed's counters.
std::shared_ptr<ddp::Sequential> residual_network(std::int64_t in, std::int64_t width, int blocks, std::int64_t out,
                                                  const ddp::Device& device) {
  std::uint64_t offset = 0;
  auto linear = [&](std::int64_t a, std::int64_t b) {
    auto layer = std::make_shared<ddp::Linear>(a, b, /*bias=*/true, /*seed=*/0, offset, device);
    offset += layer->init_counters();
    return layer;
  };
  auto net = std::make_shared<ddp::Sequential>();
  net->add(linear(in, width));
  for (int b = 0; b < blocks; ++b) {
    auto body = std::make_shared<ddp::Sequential>();
    body->add(std::make_shared<ddp::LayerNorm>(width, 1e-5, device));
    body->add(linear(width, width));
    body->add(std::make_shared<ddp::ActivationLayer>(ddp::Activation::kGelu));  // fused into the Linear
    net->add(std::make_shared<ddp::ResidualBlock>(body));
  }
  net->add(linear(width, out));
  return net;
}

long arg(int argc, char** argv, int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; }

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::install_stop_handlers();                // SIGTERM/SIGINT/SIGUSR1: stop after the same step, checkpoint
    ddp::Session session(&argc, &argv);
    if (argc < 2) {
      throw ddp::InvalidArgument("usage: residual_regression DATA_DIR [TEST_DIR [EPOCHS [WIDTH [BLOCKS [BATCH]]]]]");
    }
    const ddp::data::TrainTest sets = ddp::data::load_train_test(argv[1], argc > 2 ? argv[2] : "");
    const auto model = residual_network(sets.train.feature_count, arg(argc, argv, 4, 512),
                                        static_cast<int>(arg(argc, argv, 5, 4)), sets.train.target_width,
                                        session.device());
    ddp::TrainerOptions options{
        .batch_size = arg(argc, argv, 6, 512),
        .epochs = static_cast<int>(arg(argc, argv, 3, 20)),
        .loss = ddp::Loss::kMse,
        .optimizer = ddp::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01},
        .schedule = ddp::LrScheduleKind::kCosine,
        .warmup_epochs = 1,
        .log_every = 100,
        .name = "residual_regression",
    };
    ddp::Trainer trainer(session, *model, options);
    return trainer.fit(sets.train, sets.test);   // 0, or ddp::kStoppedExitStatus after a graceful stop
  });
}
