// A user's own training program on the library's Trainer: the main job's recipe (784-512-512-10, AdamW, cosine
// schedule, 30 epochs of Fashion-MNIST) at the main job's speed, with its checkpoints, resume and graceful stop.
//
//   ddprun -np 2 -- bazel-bin/examples/fit [CHECKPOINT_DIR [MAX_STEPS [DATA_DIR]]]
//
// At the same seed its checkpoints are train_mlp's, bit for bit (tests/examples/fit_test.sh).
#include <cstdio>
#include <cstdlib>

#include "ddp.h"
#include "runtime/data/idx.h"
#include "runtime/training/trainer.h"

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::install_stop_handlers();                // SIGTERM/SIGINT/SIGUSR1: stop after the same step, checkpoint
    ddp::Session session(&argc, &argv);          // MPI, rank, GPU, stream (every call's default), backend
    using namespace ddp::data;
    const char* dir = argc > 3 ? argv[3] : kDefaultFashionMnistDir;
    const Dataset train = load_fashion_mnist(dir, Split::kTrain), test = load_fashion_mnist(dir, Split::kTest);

    ddp::MLP model({784, 512, 512, 10}, ddp::Activation::kRelu, /*seed=*/0, session.device());
    ddp::TrainerOptions options{
        .batch_size = 128,
        .epochs = 30,
        .max_steps = argc > 2 ? std::atoll(argv[2]) : 0,
        .optimizer = ddp::AdamWOptions{.lr = 2e-3, .weight_decay = 0.05},
        .schedule = ddp::LrScheduleKind::kCosine,
        .warmup_epochs = 0.5,
        .checkpoint_dir = argc > 1 ? argv[1] : "",
        .name = "fit",
    };
    // Hooks run on every rank after each step and each evaluation: add what the loop should do there.
    bool reached = false;
    ddp::TrainerHooks hooks{.on_evaluation = [&](const ddp::EvaluationResult& r) {
      if (session.is_lead() && !reached && r.accuracy >= 0.9) std::printf("fit: 0.90 in epoch %ld\n", r.epoch);
      reached = reached || r.accuracy >= 0.9;
    }};
    ddp::Trainer trainer(session, model, options, hooks);
    return trainer.fit(train, test);             // 0, or ddp::kStoppedExitStatus after a graceful stop
  });
}
