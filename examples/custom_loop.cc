// The runtime embedded in a user's own training program: its own model, loss, data and loop, nothing from
// Fashion-MNIST or train_mlp. It exists to show (and test) what a user writes against ddp.h alone:
//   * a Module subclass with a residual structure, whose forward composes ops::linear, ops::gelu and ops::add;
//   * a synthetic regression problem, y = sin(x1) + x2·x3 + noise, generated on the fly and sharded by rank;
//   * mean squared error (ops::mse_loss), AdamW with a cosine-with-warmup schedule;
//   * DistributedDataParallel with gradient accumulation: ddp.no_sync() over the first of 2 micro-batches;
//   * evaluation under autograd::NoGradGuard on a held-out set, reduced across ranks.
// Rank 0 prints the loss every --log-every steps and `final_mse=<value>`; the exit status is non-zero unless the
// final held-out MSE is below --max-final-ratio (default 0.2) of the initial one.
//
//   mpirun -np 2 bazel-bin/examples/custom_loop [--device auto|cpu|cuda] [--steps N] ... (see --help)
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp.h"
#include "examples/cli_checks.h"

namespace custom_loop {

using ddp::Activation;
using ddp::Device;
using ddp::Stream;
using ddp::Tensor;

constexpr std::int64_t kFeatures = 3;

// ---------------------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------------------

struct Flags {
  ddp::DeviceRequest device = ddp::DeviceRequest::kAuto;
  std::string backend = "auto";  // auto: NCCL on CUDA, MPI on the CPU (or DDP_BACKEND)
  std::int64_t steps = 400;
  std::int64_t batch_size = 64;  // per rank, per micro-batch
  std::int64_t accum = 2;        // micro-batches per optimizer step
  std::int64_t hidden = 64;
  std::int64_t blocks = 2;
  double lr = 3e-3;
  std::int64_t warmup = -1;  // -1: a tenth of --steps
  double weight_decay = 1e-2;
  std::int64_t eval_size = 4096;  // held-out samples over all ranks
  std::int64_t log_every = 50;
  std::uint64_t seed = 1;
  double max_final_ratio = 0.2;
  bool shard_optimizer = false;
};

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv) {
  Flags f;
  std::string device = "auto";
  CLI::App app{"custom_loop: a user's own model, data, loss and loop on ddp.h (under mpirun for several ranks)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", device, "where each rank runs (auto: a GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--backend", f.backend, "gradient all-reduce: auto (nccl on CUDA, mpi on the CPU), nccl or mpi")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--steps", f.steps, "optimizer steps")->check(CLI::Range(1, 1000000));
  app.add_option("--batch-size", f.batch_size, "samples per rank per micro-batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("--accum", f.accum, "micro-batches per step, all but the last under ddp.no_sync()")
      ->check(CLI::Range(1, 1024));
  app.add_option("--hidden", f.hidden, "width of the residual trunk")->check(CLI::Range(1, 1 << 14));
  app.add_option("--blocks", f.blocks, "residual blocks")->check(CLI::Range(0, 64));
  // examples' number checks refuse NaN, which every range lets through.
  app.add_option("--lr", f.lr, "peak AdamW learning rate")
      ->check(examples::kNonNegativeNumber & CLI::Range(0.0, 10.0));
  app.add_option("--warmup", f.warmup, "linear warmup steps before the cosine decay (default: a tenth of --steps)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay")
      ->check(examples::kNonNegativeNumber & CLI::Range(0.0, 1.0));
  app.add_option("--eval-size", f.eval_size, "held-out samples, split over the ranks")->check(CLI::Range(1, 1 << 24));
  app.add_option("--log-every", f.log_every, "rank 0 prints the loss every N steps")->check(CLI::Range(1, 1000000));
  app.add_option("--seed", f.seed, "model and data seed")->check(examples::kSeed);
  app.add_option("--max-final-ratio", f.max_final_ratio, "fail unless final_mse < R x the initial mse")
      ->check(examples::kNonNegativeNumber & CLI::Range(0.0, 1e9));
  app.add_flag("--shard-optimizer", f.shard_optimizer, "shard AdamW's state over the ranks (ZeRO stage 1)");
  examples::parse_or_throw(app, argc, argv);
  f.device = ddp::parse_device_request(device);
  if (f.warmup < 0) f.warmup = f.steps / 10;
  if (f.warmup > f.steps) {
    throw ddp::InvalidArgument("--warmup " + std::to_string(f.warmup) + " exceeds --steps " + std::to_string(f.steps));
  }
  return f;
}

// ---------------------------------------------------------------------------------------------------------
// The model: stem -> residual blocks -> head, a user Module (not an MLP)
// ---------------------------------------------------------------------------------------------------------

// h + fc2(gelu(fc1(h))): the GELU is fused into fc1's GEMM, fc2 is a plain linear.
class ResidualBlock : public ddp::Module {
 public:
  ResidualBlock(std::int64_t width, std::uint64_t seed, std::uint64_t& offset, const Device& device,
                const Stream& stream) {
    fc1_ = std::make_shared<ddp::Linear>(width, width, true, seed, offset, device, stream);
    offset += fc1_->init_counters();
    fc2_ = std::make_shared<ddp::Linear>(width, width, true, seed, offset, device, stream);
    offset += fc2_->init_counters();
    register_module("fc1", fc1_);
    register_module("fc2", fc2_);
    set_device(device);
  }
  Tensor forward(const Tensor& h, const Stream& stream) override {
    Tensor z = ddp::ops::linear(h, fc1_->weight(), fc1_->bias(), Activation::kGelu, stream);
    z = ddp::ops::linear(z, fc2_->weight(), fc2_->bias(), Activation::kNone, stream);
    return ddp::ops::add(h, z, stream);
  }
  std::string type_name() const override { return "ResidualBlock"; }

 private:
  std::shared_ptr<ddp::Linear> fc1_, fc2_;
};

class ResidualRegressor : public ddp::Module {
 public:
  ResidualRegressor(std::int64_t in, std::int64_t hidden, std::int64_t blocks, std::uint64_t seed,
                    const Device& device, const Stream& stream) {
    // Each layer draws its initial values from its own counter range of one seed: every rank builds the same
    // model (DDP also broadcasts rank 0's), on the CPU and the GPU alike.
    std::uint64_t offset = 0;
    stem_ = std::make_shared<ddp::Linear>(in, hidden, true, seed, offset, device, stream);
    offset += stem_->init_counters();
    register_module("stem", stem_);
    for (std::int64_t i = 0; i < blocks; ++i) {
      blocks_.push_back(std::make_shared<ResidualBlock>(hidden, seed, offset, device, stream));
      register_module("block" + std::to_string(i), blocks_.back());
    }
    head_ = std::make_shared<ddp::Linear>(hidden, 1, true, seed, offset, device, stream);
    register_module("head", head_);
    set_device(device);
  }
  Tensor forward(const Tensor& x, const Stream& stream) override {
    Tensor h = ddp::ops::gelu(stem_->forward(x, stream), stream);
    for (const auto& block : blocks_) h = block->forward(h, stream);
    return head_->forward(h, stream);  // [batch, 1]
  }
  std::string type_name() const override { return "ResidualRegressor"; }

 private:
  std::shared_ptr<ddp::Linear> stem_, head_;
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
};

// ---------------------------------------------------------------------------------------------------------
// Data: an endless stream of samples, each a pure function of (seed, global index)
// ---------------------------------------------------------------------------------------------------------

// SplitMix64 finaliser: a counter-based generator, so sample i is the same whichever rank draws it and N ranks
// with batch b see exactly the samples one rank with batch N·b would.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
double unit(std::uint64_t seed, std::uint64_t counter) {  // uniform in (0, 1)
  return (static_cast<double>(mix(seed ^ mix(counter)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Training samples come from stream 0, held-out ones from stream 1 (disjoint counters).
struct Batch {
  std::vector<float> x;  // [rows, 3]
  std::vector<float> y;  // [rows, 1]
};

constexpr double kNoise = 0.05;

Batch make_batch(std::uint64_t seed, std::uint64_t stream_id, std::int64_t first, std::int64_t rows,
                 std::int64_t stride, bool noisy) {
  Batch b;
  b.x.resize(static_cast<std::size_t>(rows * kFeatures));
  b.y.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t base = ((stream_id << 56) | static_cast<std::uint64_t>(first + r * stride)) * 8;
    double x[kFeatures];
    for (int k = 0; k < kFeatures; ++k) x[k] = 4.0 * unit(seed, base + k) - 2.0;  // U(-2, 2)
    double y = std::sin(x[0]) + x[1] * x[2];
    if (noisy) {  // Box-Muller: one standard normal from two uniforms
      const double u1 = unit(seed, base + 4), u2 = unit(seed, base + 5);
      y += kNoise * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    for (int k = 0; k < kFeatures; ++k) b.x[static_cast<std::size_t>(r * kFeatures + k)] = static_cast<float>(x[k]);
    b.y[static_cast<std::size_t>(r)] = static_cast<float>(y);
  }
  return b;
}

// ---------------------------------------------------------------------------------------------------------
// Evaluation: mean squared error over the whole held-out set, each rank scoring samples r, r+N, r+2N, ...
// ---------------------------------------------------------------------------------------------------------

double evaluate(ddp::Module& model, const ddp::Session& session, const Flags& flags) {
  ddp::autograd::NoGradGuard no_grad;  // nothing recorded: no tape, no activations kept
  model.eval();
  const std::int64_t n = flags.eval_size, size = session.size(), rank = session.rank();
  const std::int64_t local = rank < n ? (n - rank + size - 1) / size : 0;
  std::vector<double> sums = {0.0, static_cast<double>(local)};  // squared error, samples
  if (local > 0) {
    const Batch b = make_batch(flags.seed, 1, rank, local, size, /*noisy=*/false);
    const Tensor x = Tensor::from_vector(b.x, {local, kFeatures}, session.device(), session.stream());
    const Tensor y = Tensor::from_vector(b.y, {local, 1}, session.device(), session.stream());
    const Tensor mse = ddp::ops::mse_loss(model.forward(x, session.stream()), y, session.stream());
    sums[0] = mse.item(session.stream()) * static_cast<double>(local);
  }
  sums = session.sum(sums);
  model.train();
  return sums[0] / sums[1];
}

// One optimizer step over `accum` micro-batches: all but the last under no_sync (local accumulation), the last
// all-reducing the sum, which one in-place scale over the flat gradients turns into the mean. Returns the
// micro-batch losses (on the device: reading them waits for the step).
std::vector<Tensor> train_step(std::int64_t step, ddp::Module& model, ddp::DistributedDataParallel& ddp_model,
                               ddp::Optimizer& optimizer, const ddp::Session& session, const Flags& flags) {
  const Stream& stream = session.stream();
  const std::int64_t b = flags.batch_size, k = flags.accum;
  model.zero_grad(stream);
  std::vector<Tensor> losses;
  for (std::int64_t m = 0; m < k; ++m) {
    // Global samples of this micro-batch: [(step·k + m)·N·b, +N·b); rank r takes its contiguous b of them.
    const std::int64_t first = ((step * k + m) * session.size() + session.rank()) * b;
    const Batch batch = make_batch(flags.seed, 0, first, b, 1, /*noisy=*/true);
    const Tensor x = Tensor::from_vector(batch.x, {b, kFeatures}, session.device(), stream);
    const Tensor y = Tensor::from_vector(batch.y, {b, 1}, session.device(), stream);
    Tensor loss = ddp::ops::mse_loss(model.forward(x, stream), y, stream);
    if (m + 1 < k) {
      auto local_only = ddp_model.no_sync();
      ddp_model.backward(loss);
    } else {
      ddp_model.backward(loss);
    }
    losses.push_back(loss);
  }
  if (k > 1) {
    Tensor grads = model.parameter_store()->flat_grads();
    grads.scale_(1.0 / static_cast<double>(k), stream);  // after the last bucket, on the compute stream
  }
  optimizer.step(stream);
  return losses;
}

int run(int argc, char** argv) {
  const auto [flags, flag_error] = examples::parse_now_report_later<Flags>([&] { return parse_flags(argc, argv); });
  ddp::SessionOptions options;
  options.device = flags.device;
  options.backend = flags.backend;
  ddp::Session session(&argc, &argv, options);
  session.agree(flag_error, "bad command line");
  const Stream& stream = session.stream();

  ResidualRegressor model(kFeatures, flags.hidden, flags.blocks, flags.seed, session.device(), stream);
  ddp::DdpOptions ddp_options;
  ddp_options.shard_optimizer = flags.shard_optimizer;  // the loop below is the same either way
  ddp::DistributedDataParallel ddp_model(model, session, ddp_options);
  ddp::AdamW optimizer(model, {.lr = flags.lr, .weight_decay = flags.weight_decay}, stream);
  ddp::CosineWithWarmup schedule(flags.lr, flags.warmup, flags.steps, /*min_lr=*/0.02 * flags.lr);
  if (session.is_lead()) {
    std::printf("custom_loop: ranks=%d device=%s backend=%s parameters=%lld steps=%lld batch=%dx%lldx%lld\n",
                session.size(), session.device().str().c_str(), ddp::backend_name(session.backend()).c_str(),
                static_cast<long long>(model.num_parameters()), static_cast<long long>(flags.steps), session.size(),
                static_cast<long long>(flags.accum), static_cast<long long>(flags.batch_size));
  }
  const double initial_mse = evaluate(model, session, flags);
  if (session.is_lead()) std::printf("initial_mse=%.6f\n", initial_mse);

  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < flags.steps; ++step) {
    schedule.apply(optimizer);
    const std::vector<Tensor> losses = train_step(step, model, ddp_model, optimizer, session, flags);
    // The host reads the loss back only when it logs (on the GPU that is a synchronisation).
    if (session.is_lead() && ((step + 1) % flags.log_every == 0 || step + 1 == flags.steps)) {
      double sum = 0.0;
      for (const Tensor& l : losses) sum += l.item(stream);
      std::printf("step %lld/%lld loss %.6f lr %.6g\n", static_cast<long long>(step + 1),
                  static_cast<long long>(flags.steps), sum / static_cast<double>(flags.accum), optimizer.lr());
      std::fflush(stdout);
    }
  }
  stream.synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const double final_mse = evaluate(model, session, flags);
  const double bound = flags.max_final_ratio * initial_mse;
  const bool ok = std::isfinite(final_mse) && final_mse < bound;
  if (session.is_lead()) {
    std::printf("train_seconds=%.2f\nfinal_mse=%.6f\n", seconds, final_mse);
    if (!ok) {
      std::fprintf(stderr, "error: final_mse %.6f is not below %.6f (%g x the initial %.6f)\n", final_mse, bound,
                   flags.max_final_ratio, initial_mse);
    }
  }
  return ok ? 0 : 1;  // every rank has the same final_mse, so every rank agrees on the status
}

}  // namespace custom_loop

int main(int argc, char** argv) {
  return ddp::run_main([&] { return custom_loop::run(argc, argv); });
}
