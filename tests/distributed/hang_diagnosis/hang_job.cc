// A small training job in which one rank can be made to hang, for the tests of what a hung job says
// (hang_report_test.sh). Each step: the runtime's batch loader (data), an MLP's forward, DDP's backward over the
// MPI backend, or NCCL with --backend nccl (four gradient buckets), the SGD step; on even steps rank 0 writes a checkpoint and every rank
// agrees on it, on odd steps an evaluation (under a PhaseGuard) sums a count over the ranks.
//   - DDP_FAULT_STALL=RANK:PHASE:STEP (runtime/core/phase.h) makes a rank stall in a phase;
//   - --mismatch R:S makes rank R issue a broadcast the others do not issue, before its backward at step S;
//   - --step-ms M sleeps in every step, so that a dump can be asked for while the job runs;
//   - --never-start R: every rank starts MPI itself, and rank R then never makes its World (the others wait in
//     the World's first collective);
//   - --stop-before-mpi R: rank R stops itself (SIGSTOP) before its World starts MPI (the others wait in MPI_Init).
//   mpirun -np 4 hang_job [--device cpu|cuda] [--backend mpi|nccl] [--steps N] [--checkpoint-dir D]
//                         [--mismatch R:S] [--step-ms M] [--never-start R] [--stop-before-mpi R]
// Rank 0 prints "step S" after each step and "done" at the end.
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddp.h"
#include "runtime/data/idx.h"
#include "runtime/data/loader.h"
#include "runtime/data/sampler.h"
#include "runtime/distributed/world.h"  // World: this test job bootstraps without a Session
#include "runtime/training/training_checkpoint.h"

namespace {

constexpr std::int64_t kFeatures = 32;
constexpr std::int64_t kBatch = 16;

struct Flags {
  std::string device = "cpu";
  std::string backend = "mpi";
  int steps = 6;
  std::string checkpoint_dir;
  int mismatch_rank = -1;
  int mismatch_step = -1;
  int step_ms = 0;
  int late_rank = -1;  // never makes its World
  int stopped_rank = -1;  // stops itself before its World starts MPI
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--device") {
      f.device = value;
    } else if (flag == "--backend") {
      f.backend = value;
    } else if (flag == "--steps") {
      f.steps = std::stoi(value);
    } else if (flag == "--checkpoint-dir") {
      f.checkpoint_dir = value;
    } else if (flag == "--mismatch") {
      DDP_CHECK(std::sscanf(value.c_str(), "%d:%d", &f.mismatch_rank, &f.mismatch_step) == 2, "--mismatch R:S");
    } else if (flag == "--step-ms") {
      f.step_ms = std::stoi(value);
    } else if (flag == "--never-start") {
      f.late_rank = std::stoi(value);
    } else if (flag == "--stop-before-mpi") {
      f.stopped_rank = std::stoi(value);
    } else {
      throw ddp::InvalidArgument("unknown flag " + flag);
    }
  }
  return f;
}

// Row i: features sin-like in i, label i % 10.
ddp::data::Dataset make_data(std::int64_t rows) {
  ddp::data::Dataset d;
  d.size = rows;
  d.feature_count = kFeatures;
  d.num_classes = 10;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t f = 0; f < kFeatures; ++f) d.features.push_back(static_cast<float>((i * 7 + f * 3) % 11) / 11.0f);
    d.labels.push_back(static_cast<std::int32_t>(i % 10));
  }
  return d;
}

// The ranks that never get through MPI_Init (--stop-before-mpi, --never-start): this one stops or hangs here.
void hold_back_before_start(const Flags& flags, int* argc, char*** argv) {
  const char* launched_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (launched_rank != nullptr && std::atoi(launched_rank) == flags.stopped_rank) {
    std::raise(SIGSTOP);  // before its World starts MPI: the others wait inside MPI_Init
  }
  if (flags.late_rank >= 0) {
    // As an application that starts MPI itself and then makes a session on every rank but one.
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == flags.late_rank) {
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
}

// Every other step: rank 0 writes a checkpoint, and every rank learns whether it could.
void checkpoint(const Flags& flags, int step, const ddp::World& world, const ddp::MLP& model,
                const ddp::Sgd& optimizer, const ddp::Stream& stream) {
  std::string error;
  if (world.rank() == 0) {
    try {
      ddp::io::CheckpointMetadata m;
      m.step = step;
      m.world_size = world.size();
      ddp::training::save_training_checkpoint(flags.checkpoint_dir, model, optimizer, m, stream);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  world.agree(error, "checkpoint write failed");
}

// The other steps: an evaluation, with its host all-reduce of the correct count.
void evaluate(const ddp::World& world, ddp::MLP& model, const ddp::Tensor& x, const ddp::Tensor& y,
              const ddp::Stream& stream) {
  ddp::PhaseGuard evaluating(ddp::Phase::kEvaluation);
  ddp::autograd::NoGradGuard no_grad;
  const ddp::Tensor correct = ddp::ops::count_correct(model.forward(x, stream), y, stream);
  world.sum(static_cast<double>(correct.to_vector<std::int64_t>(stream)[0]));
}

int run(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  hold_back_before_start(flags, &argc, &argv);
  const ddp::Backend backend = ddp::parse_backend(flags.backend);
  ddp::WorldOptions options;
  options.device = ddp::parse_device_request(flags.device);
  options.nccl = backend == ddp::Backend::kNccl;
  ddp::World world(&argc, &argv, options);
  const ddp::Device device = world.device();
  const ddp::Stream stream = device.is_cuda() ? ddp::Stream::create(device) : ddp::Stream();

  ddp::MLP model({kFeatures, 64, 64, 10}, ddp::Activation::kRelu, /*seed=*/0, device, stream);
  auto group = ddp::make_process_group(world, device, backend);
  ddp::DdpOptions ddp_options;
  // Four buckets, the plan the hang tests' messages name: [4.bias 4.weight 2.bias] passes the first cap (2.8 KB)
  // with 2.bias, then 2.weight, 0.bias and 0.weight each pass the 210-byte cap alone.
  ddp_options.first_bucket_cap_mb = 0.0027;
  ddp_options.bucket_cap_mb = 0.0002;
  ddp::DistributedDataParallel ddp_model(model.flatten_parameters(stream), *group, world, stream, ddp_options);
  ddp::Sgd optimizer(*model.parameter_store(), ddp::SgdOptions{0.01, 0.9, 0.0, 0.0, false}, stream);

  const ddp::data::Dataset data = make_data(kBatch * world.size() * 4);
  ddp::data::SamplerOptions so;
  so.dataset_size = data.size;
  so.num_replicas = world.size();
  so.rank = world.rank();
  ddp::data::LoaderOptions lo;
  lo.batch_size = kBatch;
  ddp::data::BatchLoader loader(ddp::data::view(data), ddp::data::DistributedSampler(so), lo);
  loader.start_epoch(0);
  std::vector<float> mismatch_buffer(100, 1.0f);

  for (int step = 1, epoch = 0; step <= flags.steps; ++step) {
    const ddp::data::Batch* batch = loader.next();
    if (batch == nullptr) {
      loader.start_epoch(++epoch);
      batch = loader.next();
    }
    const ddp::Tensor x = ddp::Tensor::from_vector(
        std::vector<float>(batch->features, batch->features + batch->size * kFeatures), {batch->size, kFeatures},
        device, stream);
    const ddp::Tensor y = ddp::Tensor::from_int32(std::vector<std::int32_t>(batch->labels, batch->labels + batch->size),
                                                  {batch->size}, device, stream);
    if (world.rank() == flags.mismatch_rank && step == flags.mismatch_step) {
      const ddp::Tensor extra = ddp::Tensor::from_vector(mismatch_buffer, {100}, device, stream);
      group->broadcast(ddp::CommBuffer{extra.data_ptr(), 100, ddp::DType::kFloat32, device}, 0, stream)->wait(stream);
    }
    model.zero_grad(stream);
    ddp_model.backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream));
    optimizer.step(stream);

    if (step % 2 == 0 && !flags.checkpoint_dir.empty()) checkpoint(flags, step, world, model, optimizer, stream);
    if (step % 2 == 1) evaluate(world, model, x, y, stream);
    if (flags.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(flags.step_ms));
    if (world.rank() == 0) {
      std::printf("step %d\n", step);
      std::fflush(stdout);
    }
  }
  if (world.rank() == 0) std::printf("done\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] { return run(argc, argv); });
}
