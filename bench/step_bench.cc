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
// --autotune, --serial-backward and --no-bias-epilogue set runtime/kernels/cuda/gemm_options.h (algorithm timing, one stream
// in backward, bias and activation by our own pass after the GEMM).
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "models/bf16_weights.h"
#include "runtime/kernels/cuda/gemm_options.h"
#include "runtime/core/allocator.h"
#include "ddp.h"

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
  bool autotune = false;
  bool serial_backward = false;
  bool gemm_floor = false;
  bool no_bias_epilogue = false;
  std::string optimizer = "sgd";
};

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The step's GEMMs alone (see the file comment): per layer the forward GEMM and the backward dw and dx GEMMs (no
// dx for the first layer, whose input needs no gradient), with the step's types, on random operands, timed as
// the step. Returns the median microseconds per step.
double time_gemms_alone(const Args& a, const std::vector<std::int64_t>& sizes, const Device& device,
                        const Stream& stream) {
  const bool bf16 = a.precision == "bf16";
  const kernels::MathMode math = a.precision == "tf32" ? kernels::MathMode::kTF32 : kernels::MathMode::kFloat32;
  const DType in = bf16 ? DType::kBFloat16 : DType::kFloat32;
  // As the step: bf16 GEMMs write bf16 activations and logits and float32 weight gradients.
  const kernels::LinearTypes types(in, in, DType::kFloat32);
  struct Layer {
    kernels::LinearShape shape;
    Tensor x, w, y, dy, dx, dw;
  };
  std::vector<Layer> layers;
  const std::size_t n = sizes.size() - 1;
  for (std::size_t l = 0; l < n; ++l) {
    const std::int64_t fi = sizes[l], fo = sizes[l + 1];
    Layer L{{a.batch, fi, fo}, {}, {}, {}, {}, {}, {}};
    L.x = Tensor::normal({a.batch, fi}, 0.0f, 1.0f, 11, l, device, stream).to_dtype(in, stream);
    L.w = Tensor::normal({fo, fi}, 0.0f, 0.05f, 12, l, device, stream).to_dtype(in, stream);
    L.dy = Tensor::normal({a.batch, fo}, 0.0f, 1.0f, 13, l, device, stream).to_dtype(in, stream);
    L.y = Tensor::empty({a.batch, fo}, types.output, device, stream);
    L.dw = Tensor::empty({fo, fi}, types.grad, device, stream);
    if (l > 0) L.dx = Tensor::empty({a.batch, fi}, in, device, stream);
    layers.push_back(std::move(L));
  }
  auto gemms = [&] {
    for (Layer& L : layers)
      kernels::cuda::linear_forward(types, math, L.shape, L.x.data_ptr(), L.w.data_ptr(), nullptr,
                                    kernels::Activation::kNone, L.y.data_ptr(), nullptr, stream.handle());
    for (std::size_t l = n; l-- > 0;) {
      Layer& L = layers[l];
      kernels::cuda::linear_backward(types, math, L.shape, L.dy.data_ptr(), L.x.data_ptr(),
                                     L.w.data_ptr(), nullptr, nullptr, kernels::Activation::kNone,
                                     L.dx.defined() ? L.dx.data_ptr() : nullptr, L.dw.data_ptr(), nullptr, false,
                                     nullptr, stream.handle());
    }
  };
  for (int i = 0; i < std::max(a.warmup, 2); ++i) gemms();
  stream.synchronize();
  std::vector<double> times_us;
  for (int r = 0; r < a.repeats; ++r) {
    Event e0 = Event::create(device, true), e1 = Event::create(device, true);
    e0.record(stream);
    for (int i = 0; i < a.iters; ++i) gemms();
    e1.record(stream);
    e1.synchronize();
    times_us.push_back(static_cast<double>(e1.elapsed_ms_since(e0)) * 1000.0 / a.iters);
  }
  return median(times_us);
}

int run(int argc, char** argv) {
  Args a;
  CLI::App app{"MLP training-step benchmark (the C++ side of bench/pytorch_step.py)"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as argparse: last one wins
  app.add_option("--sizes", a.sizes, "layer sizes, comma separated");
  app.add_option("--batch", a.batch, "batch per rank");
  app.add_option("--device", a.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", a.precision, "fp32 | tf32 | bf16")->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--optimizer", a.optimizer, "sgd (momentum 0.9) | adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_flag("--ddp", a.ddp, "wrap the model in DistributedDataParallel (also at world size 1)");
  app.add_flag("--graph", a.graph, "capture the whole step as a CUDA graph (falls back to eager when impossible)");
  app.add_option("--warmup", a.warmup);
  app.add_option("--iters", a.iters, "steps per repeat");
  app.add_option("--repeats", a.repeats);
  app.add_option("--stats-iters", a.stats_iters, "untimed DDP steps whose reducer figures are averaged");
  app.add_option("--threads", a.threads, "OpenBLAS threads per rank (0: cores / local ranks)");
  app.add_option("--bucket-mb", a.bucket_mb, "DDP bucket cap");
  app.add_option("--first-bucket-mb", a.first_bucket_mb, "DDP first bucket cap");
  app.add_option("--seed", a.seed);
  app.add_flag("--autotune", a.autotune, "time cuBLASLt's candidate algorithms per GEMM shape, keep the fastest");
  app.add_flag("--serial-backward", a.serial_backward, "dx and dw GEMMs on one stream (default: two)");
  app.add_flag("--gemm-floor", a.gemm_floor, "also time the step's GEMMs alone (GPU)");
  app.add_flag("--no-bias-epilogue", a.no_bias_epilogue, "bias and ReLU by our kernel after the GEMM, not cuBLASLt's epilogue");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  DDP_CHECK(a.iters > 0 && a.repeats > 0 && a.warmup >= 0 && a.batch > 0, "iters, repeats, batch must be positive");
  const std::vector<std::int64_t> sizes = parse_sizes(a.sizes);
  const bool cuda = a.device == "cuda";
  const bool bf16 = a.precision == "bf16";
  kernels::cuda::GemmOptions gemm_options = kernels::cuda::gemm_options();
  if (a.autotune) gemm_options.autotune = true;
  if (a.serial_backward) gemm_options.concurrent_backward = false;
  if (a.no_bias_epilogue) gemm_options.bias_epilogue = false;
  kernels::cuda::set_gemm_options(gemm_options);

  // The backend decides whether the world needs an NCCL communicator (DDP_BACKEND=mpi: several ranks per GPU).
  const Backend backend = default_backend(cuda ? Device::cuda(0) : Device::cpu());
  WorldOptions wo;
  wo.device = cuda ? DeviceRequest::kCuda : DeviceRequest::kCpu;
  wo.nccl = cuda && a.ddp && backend == Backend::kNccl;
  World world(&argc, &argv, wo);
  const Device device = world.device();
  const int rank = world.rank();

  int threads = a.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, world.local_size()));
  }
  openblas_set_num_threads(threads);

  Stream stream = cuda ? Stream::create(device) : Stream();
  MLP model(sizes, kernels::Activation::kRelu, a.seed, device, stream);
  if (a.precision == "tf32") model.set_math_mode(kernels::MathMode::kTF32);
  ParameterStore& store = model.flatten_parameters(stream);

  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<DistributedDataParallel> ddp;
  if (a.ddp) {
    group = make_process_group(world, device, backend);
    DdpOptions options;
    options.bucket_cap_mb = a.bucket_mb;
    options.first_bucket_cap_mb = a.first_bucket_mb;
    ddp = std::make_unique<DistributedDataParallel>(store, *group, world, stream, options);
  }
  // SGD with momentum by default; AdamW as train_mlp's recipe, with its scalars in device memory as train_mlp
  // keeps them for its graph (one more small launch per step).
  std::unique_ptr<Optimizer> optimizer_owner;
  if (a.optimizer == "adamw") {
    optimizer_owner = std::make_unique<AdamW>(store, AdamWOptions{2e-3, 0.9, 0.999, 1e-8, 0.05}, stream);
    optimizer_owner->use_device_scalars(stream);
  } else {
    optimizer_owner = std::make_unique<Sgd>(store, SgdOptions{0.01, 0.9, 0.0, 0.0, false}, stream);
  }
  Optimizer& optimizer = *optimizer_owner;
  std::unique_ptr<Bf16Weights> bf16_weights;
  if (bf16) {
    bf16_weights = std::make_unique<Bf16Weights>(store, stream);
    optimizer.set_bf16_copy(bf16_weights->flat());  // the optimizer's kernel refreshes the copy in its own pass
  }

  // Each rank its own batch: x ~ N(0, 1), labels uniform over the classes.
  const std::int64_t in = sizes.front(), classes = sizes.back();
  Tensor x = Tensor::normal({a.batch, in}, 0.0f, 1.0f, a.seed + 1, static_cast<std::uint64_t>(rank) * a.batch * in,
                            device, stream);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(a.batch));
  std::uint64_t lcg = 0x9E3779B97F4A7C15ull * (rank + 1);
  for (auto& l : labels) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<std::int32_t>((lcg >> 33) % static_cast<std::uint64_t>(classes));
  }
  Tensor y = Tensor::from_int32(labels, {a.batch}, device, stream);
  const std::vector<Tensor> params = store.parameters();
  stream.synchronize();
  if (cuda) cuda_allocator(device.index).reset_peak_stats();
  cpu_allocator().reset_peak_stats();

  // One training step. Gradients are zeroed lazily (marked "to be overwritten": backward writes every one of
  // them first), which is what zero_grad(set_to_none=True) buys PyTorch, without a memset kernel.
  // `bwd_begin`/`bwd_end` (GPU, optional) bracket the backward on the compute stream.
  Tensor last_loss;
  auto step = [&](Event* bwd_begin, Event* bwd_end) {
    autograd::zero_grad(params);
    Tensor logits = bf16 ? forward_bf16(model, *bf16_weights, x, stream) : model.forward(x, stream);
    Tensor loss = ops::cross_entropy(logits, y, stream);
    if (bwd_begin != nullptr) bwd_begin->record(stream);
    if (ddp) {
      ddp->backward(loss);
    } else {
      autograd::backward(loss, stream);
    }
    if (bwd_end != nullptr) bwd_end->record(stream);
    optimizer.step(stream);
    last_loss = loss;
  };

  for (int i = 0; i < a.warmup; ++i) step(nullptr, nullptr);
  stream.synchronize();

  // DDP figures, from untimed eager steps (on the GPU each read waits for the step).
  double backward_ms = 0, allreduce_ms = 0, exposed_ms = 0;
  int buckets = 0;
  if (ddp && a.stats_iters > 0) {
    Event b0 = cuda ? Event::create(device, true) : Event();
    Event b1 = cuda ? Event::create(device, true) : Event();
    for (int i = 0; i < a.stats_iters; ++i) {
      step(cuda ? &b0 : nullptr, cuda ? &b1 : nullptr);
      const ReducerStats& s = ddp->last_stats();
      // On the GPU the reducer's backward_ms is host enqueue time: use the device span minus the exposed wait.
      const double bwd = cuda ? (b1.synchronize(), b1.elapsed_ms_since(b0) - s.exposed_comm_ms) : s.backward_ms;
      backward_ms += bwd / a.stats_iters;
      allreduce_ms += s.allreduce_ms / a.stats_iters;
      exposed_ms += s.exposed_comm_ms / a.stats_iters;
      buckets = s.buckets;
    }
    stream.synchronize();
  }

  const std::int64_t mallocs_before = cuda ? cuda_allocator(device.index).stats().num_backend_allocs : 0;
  const std::int64_t cpu_allocs_before = cpu_allocator().stats().num_allocations;

  // CUDA graph of the whole step. Capture is refused up front where a host synchronisation would be captured
  // (the MPI backend's host staging), and detected when it fails (an unsupported call, an allocation).
  CudaGraph graph;
  std::string graph_error;
  if (a.graph) {
    if (!cuda) {
      graph_error = "--graph needs --device cuda";
    } else if (ddp && backend != Backend::kNccl) {
      graph_error = "the MPI backend stages through the host and synchronises: not capturable";
    } else {
      graph = CudaGraph::capture(stream, [&] { step(nullptr, nullptr); });
      if (!graph.captured()) {
        autograd::clear_tape();
        graph_error = graph.error();
      }
    }
    // Every rank must agree, or some would replay and others step eagerly with different collectives.
    if (world.any(!graph.captured()) && graph.captured()) {
      graph = CudaGraph();
      graph_error = "another rank could not capture";
    }
    if (!graph.captured() && rank == 0)
      std::fprintf(stderr, "step_bench: CUDA graph not used, timing eager steps instead: %s\n", graph_error.c_str());
  }
  const bool captured = graph.captured();

  auto run_step = [&] {
    if (captured) {
      graph.replay(stream);
    } else {
      step(nullptr, nullptr);
    }
  };
  if (captured) {
    for (int i = 0; i < std::max(3, a.warmup / 2); ++i) run_step();
    stream.synchronize();
  }

  std::vector<double> times_us;
  for (int r = 0; r < a.repeats; ++r) {
    if (cuda) {
      Event e0 = Event::create(device, true), e1 = Event::create(device, true);
      e0.record(stream);
      for (int i = 0; i < a.iters; ++i) run_step();
      e1.record(stream);
      e1.synchronize();
      times_us.push_back(static_cast<double>(e1.elapsed_ms_since(e0)) * 1000.0 / a.iters);
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.iters; ++i) run_step();
      times_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                         a.iters);
    }
  }
  stream.synchronize();

  const std::int64_t mallocs_after =
      cuda ? cuda_allocator(device.index).stats().num_backend_allocs - mallocs_before : 0;
  const double cpu_allocs_per_step = static_cast<double>(cpu_allocator().stats().num_allocations - cpu_allocs_before) /
                                     (static_cast<double>(a.repeats) * a.iters);
  const double loss = static_cast<double>(last_loss.to_vector<float>(stream)[0]);
  const double step_us = world.max(median(times_us));
  const double peak = world.max(static_cast<double>(cuda ? cuda_allocator(device.index).stats().peak_bytes_in_use
                                      : cpu_allocator().stats().peak_bytes_in_use));
  const double mallocs_max = world.max(static_cast<double>(mallocs_after));
  // After the step's figures: its buffers must not count in the step's peak memory or allocations.
  const double gemm_us = a.gemm_floor && cuda ? world.max(time_gemms_alone(a, sizes, device, stream)) : 0.0;
  backward_ms = world.sum(backward_ms) / world.size();  // means over ranks
  allreduce_ms = world.sum(allreduce_ms) / world.size();
  exposed_ms = world.sum(exposed_ms) / world.size();

  if (rank == 0) {
    nlohmann::json j;
    j["impl"] = captured ? "ddp-cpp-graph" : "ddp-cpp";
    j["sizes"] = a.sizes;
    j["optimizer"] = a.optimizer;
    j["batch"] = a.batch;
    j["device"] = a.device;
    j["precision"] = a.precision;
    j["ranks"] = world.size();
    j["ddp"] = a.ddp;
    j["backend"] = a.ddp ? backend_name(backend) : "none";
    j["graph"] = captured;
    if (a.graph && !captured) j["graph_error"] = graph_error;
    j["threads"] = cuda ? 0 : threads;
    j["step_us"] = step_us;
    j["samples_per_s"] = static_cast<double>(a.batch) * world.size() / step_us * 1e6;
    j["peak_bytes"] = static_cast<std::int64_t>(peak);
    j["mallocs_after_warmup"] = static_cast<std::int64_t>(mallocs_max);
    j["cpu_allocs_per_step"] = cpu_allocs_per_step;
    j["loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr);
    j["times_us"] = times_us;
    j["autotune"] = gemm_options.autotune;
    j["concurrent_backward"] = gemm_options.concurrent_backward;
    j["bias_epilogue"] = gemm_options.bias_epilogue;
    if (gemm_us > 0) j["gemm_us"] = gemm_us;
    if (a.ddp) {
      j["bucket_mb"] = a.bucket_mb;
      j["buckets"] = buckets;
      j["backward_ms"] = backward_ms;
      j["allreduce_ms"] = allreduce_ms;
      j["exposed_comm_ms"] = exposed_ms;
      j["hidden_comm_fraction"] =
          allreduce_ms > 0 ? nlohmann::json(std::clamp(1.0 - exposed_ms / allreduce_ms, 0.0, 1.0)) : nlohmann::json(nullptr);
    }
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  return ddp::run_main([&] { return ddp::run(argc, argv); });
}
