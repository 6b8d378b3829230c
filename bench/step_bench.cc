// step_bench: the MLP training step (forward, cross-entropy, backward, SGD momentum 0.9, lr 0.01),
// on the CPU or one GPU per rank, optionally wrapped in DistributedDataParallel and captured as a
// CUDA graph. It exists to be compared with bench/pytorch_step.py, which times the same step the same way and
// prints a JSON line with the same keys; bench/run_cpu.sh and bench/run_gpu.sh run both and print the ratios.
//
//   mpirun -np 2 bazel-bin/bench/step_bench --sizes 784,1024,1024,10 --batch 128 --device cpu --ddp
//   step_bench --sizes 784,1024,1024,10 --batch 256 --device cuda --precision fp32 --graph
//
// Timing: after --warmup steps, --repeats times the mean of --iters steps (CUDA events on the GPU, the steady
// clock on the CPU); step_us is the median of the repeats, the maximum over ranks. With --ddp a separate,
// untimed pass reads the reducer's per-step figures (reading them synchronises on the GPU).
//
// --gemm-floor (GPU) also times the step's GEMMs alone, timed the same way: the same cuBLASLt calls (shapes,
// types, transposes, algorithms, the same dx/dw streams) with no epilogue and nothing else around them. The step
// over that time is what the rest of the step costs (a step within 5% of its GEMMs alone is the goal).
// --recorder-ab times the step with the flight recorder (runtime/distributed/hang_diagnosis/flight_recorder.h: the
// record of collectives and phases) on and off in the same run, alternating repeats (on/off, off/on, ...); step_us
// stays the default (on), and the JSON adds both medians and the median of the paired ratios. A replayed CUDA graph
// records nothing: compare eager steps.
// --ddp-ab times the eager step with DistributedDataParallel and without it, alternating repeats the same way:
// two models of the same sizes and seed in this process, one wrapped, one not. step_us is the wrapped one's;
// the JSON adds the unwrapped median and the median of the paired ratios: DDP's own cost at this world size.
// Its peak memory counts both models.
// Written against ddp.h, as a user's program, with three internal headers named where they are used: the GEMM
// floor (bench/gemm_floor.h) and the GEMM options the JSON reports reach into the kernel layer, the allocator's
// statistics (peak bytes, allocation counts) into runtime/core/allocator.h, and --recorder-ab into the flight
// recorder's switch.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/gemm_floor.h"
#include "bench/timing.h"
#include "ddp.h"
#include "runtime/core/allocator.h"  // memory_stats, reset_peak_memory_stats
#include "runtime/core/graph.h"
#include "runtime/distributed/bucket_optimizer_shard.h"
#include "runtime/distributed/hang_diagnosis/flight_recorder.h"
#include "runtime/distributed/reducer.h"
#include "runtime/kernels/cuda/gemm_options.h"  // GemmOptions, reported in the JSON
#include "runtime/models/bf16_weights.h"

namespace ddp {
namespace {

struct Args {
  std::string sizes = "784,1024,1024,10";
  std::int64_t batch = 256;
  std::string device = "cuda";
  std::string precision = "fp32";
  bool ddp = false;
  bool graph = false;
  int warmup = 10;
  int iters = 20;
  int repeats = 5;
  int stats_iters = 10;
  int threads = 0;
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  std::uint64_t seed = 0;
  bool gemm_floor = false;
  std::string optimizer = "sgd";
  bool recorder_ab = false;
  bool ddp_ab = false;
  bool shard_optimizer = false;
  bool overlap_optimizer = false;
};

// Parses the command line; nullopt after --help or a parse error, whose exit status goes to `status`.
std::optional<Args> parse_args(int argc, char** argv, int* status) {
  Args a;
  CLI::App app{"MLP training-step benchmark (the C++ side of bench/pytorch_step.py)"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as argparse: last one wins
  app.add_option("--sizes", a.sizes, "layer sizes, comma separated");
  app.add_option("--batch", a.batch, "batch per rank");
  app.add_option("--device", a.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", a.precision, "fp32 | tf32 | bf16")->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--optimizer", a.optimizer, "sgd (momentum 0.9) | adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_flag("--ddp", a.ddp, "wrap the model in DistributedDataParallel (also at world size 1)");
  app.add_flag("--shard-optimizer", a.shard_optimizer, "with --ddp: shard the optimizer state over the ranks (ZeRO 1)");
  app.add_flag("--overlap-optimizer", a.overlap_optimizer,
               "with --ddp: update each bucket as soon as its all-reduce is done (DdpOptions::overlap_optimizer)");
  app.add_flag("--graph", a.graph, "capture the whole step as a CUDA graph (falls back to eager when impossible)");
  app.add_option("--warmup", a.warmup);
  app.add_option("--iters", a.iters, "steps per repeat");
  app.add_option("--repeats", a.repeats);
  app.add_option("--stats-iters", a.stats_iters, "untimed DDP steps whose reducer figures are averaged");
  app.add_option("--threads", a.threads, "OpenBLAS threads per rank (0: cores / local ranks)");
  app.add_option("--bucket-mb", a.bucket_mb, "DDP bucket cap");
  app.add_option("--first-bucket-mb", a.first_bucket_mb, "DDP first bucket cap");
  app.add_option("--seed", a.seed);
  app.add_flag("--gemm-floor", a.gemm_floor, "also time the step's GEMMs alone (GPU)");
  app.add_flag("--recorder-ab", a.recorder_ab, "time the step with the flight recorder on and off, alternating repeats");
  app.add_flag("--ddp-ab", a.ddp_ab, "time the eager step with DDP and without, alternating repeats (implies --ddp)")
      ->excludes("--recorder-ab", "--graph");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *status = app.exit(e);
    return std::nullopt;
  }
  DDP_CHECK(a.iters > 0 && a.repeats > 0 && a.warmup >= 0 && a.batch > 0, "iters, repeats, batch must be positive");
  if (a.ddp_ab) a.ddp = true;
  return a;
}

std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    DDP_CHECK(!item.empty(), "--sizes: empty entry in '" + text + "'");
    out.push_back(std::stoll(item));
  }
  DDP_CHECK(out.size() >= 2, "--sizes needs at least two sizes, got '" + text + "'");
  return out;
}

// The reducer's per-step figures, averaged over untimed steps.
struct DdpFigures {
  double backward_ms = 0, allreduce_ms = 0, exposed_ms = 0;
  double allgather_ms = 0, exposed_allgather_ms = 0;  // sharded: the parameters' all-gathers after the update
  int buckets = 0;
};

// An A/B's order of arms over its timed repeats: A B, B A, A B, ... so that drift in the machine's speed falls on
// both alike. True when repeat `r` times arm A.
bool first_arm(int r) { return (r % 2 == 0) == (r / 2 % 2 == 0); }

// What a run measured, before the ranks' figures are combined.
struct Measured {
  std::vector<double> times_us;
  std::vector<double> times_b_us;  // an A/B's other arm: the flight recorder off (--recorder-ab), no DDP (--ddp-ab)
  std::int64_t optimizer_state_bytes = 0;  // this rank's (sharded: its share)
  DdpFigures ddp;
  std::string graph_error;
  bool captured = false;
  std::int64_t device_mallocs = 0;  // backend allocations (cudaMalloc) during the timed steps
  std::int64_t peak_bytes = 0;      // the device's peak in use from warm-up to the last timed step
  double cpu_allocs_per_step = 0;
  double loss = 0;
};

// One rank's benchmarked step: the MLP, its optimizer (SGD with momentum, or AdamW as train_mlp's recipe with
// its scalars in device memory as train_mlp keeps them for its graph), DDP when asked, and a fixed batch.
class StepBench {
 public:
  StepBench(const Args& a, Session& session, const std::vector<std::int64_t>& sizes)
      : a_(a), session_(session), stream_(session.stream()),
        model_(sizes, Activation::kRelu, a.seed, session.device(), stream_) {
    if (a.precision == "tf32") model_.set_math_mode(MathMode::kTF32);
    model_.flatten_parameters(stream_);
    if (a.ddp) {
      ddp_ = std::make_unique<DistributedDataParallel>(
          model_, session,
          DdpOptions{.bucket_cap_mb = a.bucket_mb, .first_bucket_cap_mb = a.first_bucket_mb,
                     .shard_optimizer = a.shard_optimizer, .overlap_optimizer = a.overlap_optimizer});
    }
    if (a.optimizer == "adamw") {
      optimizer_ = std::make_unique<AdamW>(model_, AdamWOptions{2e-3, 0.9, 0.999, 1e-8, 0.05}, stream_);
      optimizer_->use_device_scalars(stream_);
    } else {
      optimizer_ = std::make_unique<Sgd>(model_, SgdOptions{0.01, 0.9, 0.0, 0.0, false}, stream_);
    }
    if (a.precision == "bf16") {
      bf16_weights_ = std::make_unique<Bf16Weights>(*model_.parameter_store(), stream_);
      optimizer_->set_bf16_copy(bf16_weights_->flat());  // the optimizer's kernel refreshes the copy in its own pass
    }
    make_batch(sizes.front(), sizes.back());
    params_ = model_.parameters();
  }

  // One training step. Gradients are zeroed lazily (marked "to be overwritten": backward writes every one of
  // them first), which is what zero_grad(set_to_none=True) buys PyTorch, without a memset kernel.
  // `bwd_begin`/`bwd_end` (GPU, optional) bracket the backward on the compute stream.
  void step(Event* bwd_begin = nullptr, Event* bwd_end = nullptr) {
    autograd::zero_grad(params_);
    Tensor logits = bf16_weights_ ? forward_bf16(model_, *bf16_weights_, x_, stream_) : model_.forward(x_, stream_);
    Tensor loss = ops::cross_entropy(logits, y_, stream_);
    if (bwd_begin != nullptr) bwd_begin->record(stream_);
    if (ddp_) {
      ddp_->backward(loss);
    } else {
      autograd::backward(loss, stream_);
    }
    if (bwd_end != nullptr) bwd_end->record(stream_);
    optimizer_->step(stream_);
    last_loss_ = loss;
  }

  // DDP figures, from untimed eager steps (on the GPU each read waits for the step).
  DdpFigures ddp_figures() {
    DdpFigures f;
    if (!ddp_ || a_.stats_iters <= 0) return f;
    const bool cuda = session_.device().is_cuda();
    Event b0 = cuda ? Event::create(session_.device(), true) : Event();
    Event b1 = cuda ? Event::create(session_.device(), true) : Event();
    for (int i = 0; i < a_.stats_iters; ++i) {
      step(cuda ? &b0 : nullptr, cuda ? &b1 : nullptr);
      const ReducerStats& s = ddp_->last_stats();
      // On the GPU the reducer's backward_ms is host enqueue time: use the device span minus the exposed wait.
      const double bwd = cuda ? (b1.synchronize(), b1.elapsed_ms_since(b0) - s.exposed_comm_ms) : s.backward_ms;
      f.backward_ms += bwd / a_.stats_iters;
      f.allreduce_ms += s.allreduce_ms / a_.stats_iters;
      f.exposed_ms += s.exposed_comm_ms / a_.stats_iters;
      f.buckets = s.buckets;
      const GatherStats& g = ddp_->last_gather_stats();
      f.allgather_ms += g.gather_ms / a_.stats_iters;
      f.exposed_allgather_ms += g.exposed_ms / a_.stats_iters;
    }
    stream_.synchronize();
    return f;
  }

  // A CUDA graph of the whole step. Refused up front where a host synchronisation would be captured (the MPI
  // backend's host staging), and detected when it fails (an unsupported call, an allocation). Returns why the
  // step is not captured, "" when it is.
  std::string capture_graph() {
    std::string error;
    if (!session_.device().is_cuda()) {
      error = "--graph needs --device cuda";
    } else if (ddp_ && session_.backend() != Backend::kNccl) {
      error = "the MPI backend stages through the host and synchronises: not capturable";
    } else {
      graph_ = CudaGraph::capture(stream_, [&] { step(); });
      if (!graph_.captured()) {
        autograd::clear_tape();
        error = graph_.error();
      }
    }
    // Every rank must agree, or some would replay and others step eagerly with different collectives.
    if (session_.any(!graph_.captured()) && graph_.captured()) {
      graph_ = CudaGraph();
      error = "another rank could not capture";
    }
    if (graph_.captured()) {
      for (int i = 0; i < std::max(3, a_.warmup / 2); ++i) run_step();
      stream_.synchronize();
    }
    return error;
  }

  // --repeats times the mean of --iters steps (bench/timing.h). With --recorder-ab every repeat is timed twice,
  // the recorder on and off in the order of first_arm.
  void time_steps(Measured* m) {
    for (int r = 0; r < a_.repeats * (a_.recorder_ab ? 2 : 1); ++r) {
      const bool recorder_on = !a_.recorder_ab || first_arm(r);
      set_flight_recorder_enabled(recorder_on);
      (recorder_on ? m->times_us : m->times_b_us).push_back(time_repeat());
    }
    set_flight_recorder_enabled(true);
    stream_.synchronize();
  }

  // --ddp-ab: each repeat timed on this (wrapped) step and on `other`'s, in the order of first_arm.
  void time_against(StepBench& other, Measured* m) {
    for (int r = 0; r < a_.repeats * 2; ++r) {
      const bool mine = first_arm(r);
      (mine ? m->times_us : m->times_b_us).push_back(mine ? time_repeat() : other.time_repeat());
    }
    stream_.synchronize();
  }

  // The mean time of one repeat of --iters steps (bench/timing.h).
  double time_repeat() { return bench::time_per_call_us([&] { run_step(); }, a_.iters, stream_); }

  void warm_up() {
    for (int i = 0; i < a_.warmup; ++i) step();
    stream_.synchronize();
  }

  // The steps: warm-up, the DDP figures, the graph, the timed repeats, with the allocator counters around them.
  // `without_ddp` (--ddp-ab) is the unwrapped twin whose repeats alternate with this one's.
  Measured measure(StepBench* without_ddp = nullptr) {
    const Device& device = session_.device();
    const bool cuda = device.is_cuda();
    stream_.synchronize();
    reset_peak_memory_stats(device);
    if (cuda) reset_peak_memory_stats(Device::cpu());
    warm_up();
    if (without_ddp != nullptr) without_ddp->warm_up();
    Measured m;
    m.ddp = ddp_figures();
    const std::int64_t mallocs_before = cuda ? memory_stats(device).num_backend_allocs : 0;
    const std::int64_t cpu_allocs_before = memory_stats(Device::cpu()).num_allocations;
    if (a_.graph) {
      m.graph_error = capture_graph();
      if (!graph_.captured() && session_.is_lead()) {
        std::fprintf(stderr, "step_bench: CUDA graph not used, timing eager steps instead: %s\n",
                     m.graph_error.c_str());
      }
    }
    m.captured = graph_.captured();
    if (without_ddp != nullptr) {
      time_against(*without_ddp, &m);
    } else {
      time_steps(&m);
    }
    m.device_mallocs = cuda ? memory_stats(device).num_backend_allocs - mallocs_before : 0;
    m.cpu_allocs_per_step = static_cast<double>(memory_stats(Device::cpu()).num_allocations - cpu_allocs_before) /
                            (static_cast<double>(a_.repeats) * a_.iters);
    m.loss = last_loss_.item(stream_);
    m.peak_bytes = memory_stats(device).peak_bytes_in_use;
    for (const auto& entry : optimizer_->state()) m.optimizer_state_bytes += entry.second.numel() * 4;
    return m;
  }

 private:
  void run_step() {
    if (graph_.captured()) {
      graph_.replay(stream_);
    } else {
      step();
    }
  }

  // Each rank its own batch: x ~ N(0, 1), labels uniform over the classes.
  void make_batch(std::int64_t in, std::int64_t classes) {
    const int rank = session_.rank();
    x_ = Tensor::normal({a_.batch, in}, 0.0f, 1.0f, a_.seed + 1, static_cast<std::uint64_t>(rank) * a_.batch * in,
                        session_.device(), stream_);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(a_.batch));
    std::uint64_t lcg = 0x9E3779B97F4A7C15ull * (rank + 1);
    for (auto& l : labels) {
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      l = static_cast<std::int32_t>((lcg >> 33) % static_cast<std::uint64_t>(classes));
    }
    y_ = Tensor::from_int32(labels, {a_.batch}, session_.device(), stream_);
  }

  const Args& a_;
  Session& session_;
  const Stream& stream_;
  MLP model_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Bf16Weights> bf16_weights_;
  Tensor x_, y_, last_loss_;
  std::vector<Tensor> params_;
  CudaGraph graph_;
};

// Rank 0's JSON line, with the same keys as bench/pytorch_step.py's; times are the maximum over ranks, the DDP
// figures their means.
void report(const Args& a, Session& session, const Measured& m, const GemmOptions& gemm, double gemm_us) {
  const double step_us = session.max(bench::median(m.times_us));
  const double peak = session.max(static_cast<double>(m.peak_bytes));
  const double mallocs_max = session.max(static_cast<double>(m.device_mallocs));
  const std::vector<double> ddp_ms = session.sum(
      {m.ddp.backward_ms, m.ddp.allreduce_ms, m.ddp.exposed_ms, m.ddp.allgather_ms, m.ddp.exposed_allgather_ms});
  const double backward_ms = ddp_ms[0] / session.size(), allreduce_ms = ddp_ms[1] / session.size(),
               exposed_ms = ddp_ms[2] / session.size(), allgather_ms = ddp_ms[3] / session.size(),
               exposed_allgather_ms = ddp_ms[4] / session.size();
  double step_b_us = 0, paired_overhead = 0;
  if (a.recorder_ab || a.ddp_ab) {
    step_b_us = session.max(bench::median(m.times_b_us));
    std::vector<double> ratios;
    for (std::size_t k = 0; k < m.times_us.size(); ++k) ratios.push_back(m.times_us[k] / m.times_b_us[k] - 1.0);
    paired_overhead = session.max(bench::median(ratios));
  }
  const double state_bytes = session.max(static_cast<double>(m.optimizer_state_bytes));
  if (!session.is_lead()) return;
  nlohmann::json j;
  j["impl"] = m.captured ? "ddp-cpp-graph" : "ddp-cpp";
  j["sizes"] = a.sizes;
  j["optimizer"] = a.optimizer;
  j["batch"] = a.batch;
  j["device"] = a.device;
  j["precision"] = a.precision;
  j["ranks"] = session.size();
  j["ddp"] = a.ddp;
  j["backend"] = a.ddp ? backend_name(session.backend()) : "none";
  j["graph"] = m.captured;
  if (a.graph && !m.captured) j["graph_error"] = m.graph_error;
  j["threads"] = session.cpu_threads();
  j["step_us"] = step_us;
  j["samples_per_s"] = static_cast<double>(a.batch) * session.size() / step_us * 1e6;
  j["peak_bytes"] = static_cast<std::int64_t>(peak);
  j["mallocs_after_warmup"] = static_cast<std::int64_t>(mallocs_max);
  j["cpu_allocs_per_step"] = m.cpu_allocs_per_step;
  j["loss"] = std::isfinite(m.loss) ? nlohmann::json(m.loss) : nlohmann::json(nullptr);
  j["times_us"] = m.times_us;
  j["narrow_layers"] = gemm.narrow_layers;
  if (gemm_us > 0) j["gemm_us"] = gemm_us;
  if (a.recorder_ab) {
    j["step_us_recorder_off"] = step_b_us;
    j["recorder_overhead"] = step_us / step_b_us - 1.0;
    j["recorder_overhead_paired"] = paired_overhead;
    j["times_off_us"] = m.times_b_us;
  }
  if (a.ddp_ab) {
    j["step_us_no_ddp"] = step_b_us;
    j["ddp_overhead"] = step_us / step_b_us - 1.0;
    j["ddp_overhead_paired"] = paired_overhead;
    j["times_no_ddp_us"] = m.times_b_us;
  }
  if (a.ddp) {
    j["bucket_mb"] = a.bucket_mb;
    j["buckets"] = m.ddp.buckets;
    j["backward_ms"] = backward_ms;
    j["allreduce_ms"] = allreduce_ms;
    j["exposed_comm_ms"] = exposed_ms;
    j["hidden_comm_fraction"] =
        allreduce_ms > 0 ? nlohmann::json(std::clamp(1.0 - exposed_ms / allreduce_ms, 0.0, 1.0)) : nlohmann::json(nullptr);
    j["shard_optimizer"] = a.shard_optimizer;
    j["overlap_optimizer"] = a.overlap_optimizer;
    if (a.shard_optimizer) {
      j["allgather_ms"] = allgather_ms;
      j["exposed_allgather_ms"] = exposed_allgather_ms;
    }
  }
  j["optimizer_state_bytes"] = static_cast<std::int64_t>(state_bytes);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  int status = 0;
  const std::optional<Args> args = parse_args(argc, argv, &status);
  if (!args) return status;
  const Args& a = *args;
  const std::vector<std::int64_t> sizes = parse_sizes(a.sizes);
  const GemmOptions gemm = gemm_options();

  SessionOptions options;
  options.device = a.device == "cuda" ? DeviceRequest::kCuda : DeviceRequest::kCpu;
  options.process_group = a.ddp;  // without --ddp no NCCL communicator either (DDP_BACKEND=mpi: ranks share a GPU)
  options.cpu_threads = a.threads;
  Session session(&argc, &argv, options);
  StepBench bench(a, session, sizes);
  Args plain = a;  // the unwrapped twin's arguments (StepBench keeps a reference)
  plain.ddp = false;
  std::unique_ptr<StepBench> without_ddp;
  if (a.ddp_ab) without_ddp = std::make_unique<StepBench>(plain, session, sizes);
  const Measured m = bench.measure(without_ddp.get());
  // After the step's figures: the GEMM floor's buffers must not count in the step's peak memory or allocations.
  const bool cuda = session.device().is_cuda();
  const double gemm_us =
      a.gemm_floor && cuda
          ? session.max(bench::time_gemms_alone({a.batch, a.precision, a.warmup, a.iters, a.repeats}, sizes,
                                                session.device(), session.stream()))
          : 0.0;
  report(a, session, m, gemm, gemm_us);
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  return ddp::run_main([&] { return ddp::run(argc, argv); });
}
