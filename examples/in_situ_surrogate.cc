// An MPI simulation that trains a surrogate of itself while it runs: the seed's halo exchange grown into the
// pattern TorchFort is used for, on the runtime embedded through the application's communicator (ddp_mpi.h).
//
// The solver: nonlinear heat diffusion on a plate split by rows across the simulation ranks (the cell update in
// examples/in_situ_heat.h), the top edge hot, the other edges cold, random hot spots inside. Each step overlaps
// the halo exchange with the interior update: the boundary rows go out and the ghost rows come in by
// nonblocking MPI on the application's own communicator while the rows that need no ghost row are updated;
// then the two boundary rows. On the GPU the plate lives in device memory the application allocates itself
// and its own kernels update it; the exchange runs on a second stream (the boundary rows through pinned host
// buffers, as this MPI is not CUDA-aware) while the first updates the interior.
// The surrogate: an MLP from a cell's 5-point stencil (u and its neighbours' differences from u) to its update
// (u' − u) / r, learned online from the solver's states as they come: every --sample-every steps each
// simulation rank draws --samples cells of its band and hands them to training, whose replay buffer (a fixed
// bound per rank) they enter after the surrogate was scored on them, unseen: the printed error is on states it
// never trained on. On the GPU the samples are drawn by a kernel into device arrays that training reads in
// place (Tensor::from_blob): from the plate to the replay buffer and into a batch, nothing passes through the
// host. Training runs beside the solver, on a stream of its own (events hand the samples over) and a host thread of
// its own (examples/training_thread.h), so the solver's steps wait for neither (InSituJob::step).
//
// Layouts (--layout):
//   all    every rank simulates its band and trains on its own samples; gradients averaged over all ranks.
//   split  the world split in two: the first half (rounded up) simulates (its own communicator for the halos)
//          and sends samples to the rest, which trains (a Session on the training ranks' communicator only).
//          Between processes the samples go through the host (MPI messages).
//
//   mpirun -np 4 bazel-bin/examples/in_situ_surrogate --layout split [--device cuda] [--steps 600] [--rows 64]
// Prints `step S surrogate_rel_error E` as it goes, then `solver_steps_per_s=` (the solver's pace with the
// training beside it), `plate_heat=H` (the plate's sum, the same on every device and decomposition) and
// `final_rel_error=E`; exits 1 unless E < --max-error.
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp.h"
#include "ddp_mpi.h"
#include "examples/in_situ_heat.h"
#include "examples/in_situ_heat_kernels.h"
#include "examples/training_thread.h"
#include "runtime/data/replay_buffer.h"
#include "runtime/training/train_step.h"

namespace {

using in_situ::kInputs;

struct Flags {
  std::string layout = "all";
  std::string device = "auto", backend = "auto", training_thread = "auto";
  long long rows = 64, cols = 64, steps = 600;
  long long sample_every = 5, samples = 256, train_steps = 12, batch = 256, capacity = 8192;
  double lr = 2e-3, max_error = 0.35;
  long long log_every = 100;
};

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

void copy_async(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  cuda_check(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
}

// `n` floats of device memory (pinned host memory when `pinned`), allocated as the application does.
float* allocate_floats(std::size_t n, bool pinned = false) {
  void* p = nullptr;
  cuda_check(pinned ? cudaMallocHost(&p, n * sizeof(float)) : cudaMalloc(&p, n * sizeof(float)),
             pinned ? "cudaMallocHost" : "cudaMalloc");
  return static_cast<float*>(p);
}

// Where this rank computes: its GPU (local rank modulo the node's GPUs) or the host.
struct Placement {
  bool gpu = false;
  int gpu_index = -1;
};

// --device cuda: the GPUs, rank r of a node on GPU r % (the node's GPUs), so ranks may share one (the training
// ranks then need --backend mpi); auto: the GPUs where every rank has one of its own, else the host.
// Collective over `world`; throws std::invalid_argument on every rank alike for cuda where some rank sees none.
Placement place(const std::string& device, MPI_Comm world) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  MPI_Comm node = MPI_COMM_NULL;
  int world_rank = 0, local = 0, local_size = 1;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int everywhere[2] = {count > 0 ? 1 : 0, count >= local_size ? 1 : 0};  // a GPU seen; a GPU of its own
  MPI_Allreduce(MPI_IN_PLACE, everywhere, 2, MPI_INT, MPI_MIN, world);
  if (device == "cpu" || (device == "auto" && everywhere[1] == 0)) return {};
  if (everywhere[0] == 0) throw std::invalid_argument("--device cuda: some rank sees no GPU; use --device cpu or auto");
  Placement p{true, local % count};
  cuda_check(cudaSetDevice(p.gpu_index), "cudaSetDevice");
  return p;
}

// The plate's initial temperatures for a band: the top edge hot, two hot spots inside.
std::vector<float> initial_band(long long begin, long long rows, long long cols, long long total_rows) {
  std::vector<float> u(static_cast<std::size_t>((rows + 2) * (cols + 2)), 0.0f);
  for (long long r = 0; r < rows + 2; ++r) {
    for (long long c = 0; c < cols + 2; ++c) {
      const long long g = begin + r;  // global row, 0 = the hot top edge
      const double y = double(g) / total_rows, x = double(c) / (cols + 1);
      float v = g == 0 ? 1.0f : 0.0f;
      if (g > 0 && c > 0 && c < cols + 1 && g < total_rows + 1) {
        v = static_cast<float>(0.9 * std::exp(-40 * ((x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6))) +
                               0.7 * std::exp(-60 * ((x - 0.75) * (x - 0.75) + (y - 0.3) * (y - 0.3))));
      }
      u[static_cast<std::size_t>(r * (cols + 2) + c)] = v;
    }
  }
  return u;
}

// One band of the plate, rows [begin, begin + rows) of the interior with a ghost row above and below
// (examples/in_situ_heat.h), and room for the samples drawn from it: in host memory, or in device memory the
// application allocates and its kernels update on its own stream (a second one carries the halos).
class Band {
 public:
  Band(long long begin, long long rows, long long cols, long long total_rows, long long samples, bool gpu)
      : rows_(rows), cols_(cols), width_(cols + 2), gpu_(gpu) {
    const std::vector<float> u = initial_band(begin, rows, cols, total_rows);
    const std::size_t cells = u.size(), room = static_cast<std::size_t>(samples);
    if (!gpu_) {
      host_ = {u, u, std::vector<float>(room * kInputs), std::vector<float>(room)};
      u_ = host_[0].data(), next_ = host_[1].data(), x_ = host_[2].data(), y_ = host_[3].data();
      return;
    }
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&halo_, cudaEventDisableTiming), "cudaEventCreate");
    for (float** p : {&u_, &next_}) {  // the fixed edges start equal in both, and stay
      *p = allocate_floats(cells);
      cuda_check(cudaMemcpy(*p, u.data(), cells * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    x_ = allocate_floats(room * kInputs);
    y_ = allocate_floats(room);
    pinned_ = allocate_floats(4 * static_cast<std::size_t>(width_), /*pinned=*/true);
  }
  ~Band() {
    if (!gpu_) return;
    cudaStreamSynchronize(stream_);
    for (float* p : {u_, next_, x_, y_}) cudaFree(p);
    cudaFreeHost(pinned_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(halo_);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(stream_);
  }
  Band(const Band&) = delete;
  Band& operator=(const Band&) = delete;

  // One solver step on `comm` (the simulation ranks), the interior updated while the halos travel: a kernel
  // launched before the messages are posted on the GPU, the host loop after they are posted on the CPU.
  void step(MPI_Comm comm, int rank, int size) {
    const bool up = rank > 0, down = rank < size - 1;
    // Where MPI reads the boundary rows and writes the ghost rows: the band itself on the host; pinned
    // buffers on the GPU, filled on the copy stream once the last step's update is done.
    const float* out[2] = {row(u_, 1), row(u_, rows_)};
    float* in[2] = {row(u_, 0), row(u_, rows_ + 1)};
    if (gpu_) {
      cuda_check(cudaEventRecord(ready_, stream_), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(copy_, ready_, 0), "cudaStreamWaitEvent");
      for (int k = 0; k < 2; ++k) {
        if (k == 0 ? up : down) {
          copy_async(pinned_ + k * width_, out[k], row_bytes(), cudaMemcpyDeviceToHost, copy_);
        }
        out[k] = pinned_ + k * width_;
        in[k] = pinned_ + (2 + k) * width_;
      }
      update_rows(2, rows_ - 1);
      cuda_check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize");
    }
    MPI_Request requests[4];
    int n = 0;
    const int count = static_cast<int>(width_);
    if (up) {
      MPI_Irecv(in[0], count, MPI_FLOAT, rank - 1, 1, comm, &requests[n++]);
      MPI_Isend(out[0], count, MPI_FLOAT, rank - 1, 2, comm, &requests[n++]);
    }
    if (down) {
      MPI_Irecv(in[1], count, MPI_FLOAT, rank + 1, 2, comm, &requests[n++]);
      MPI_Isend(out[1], count, MPI_FLOAT, rank + 1, 1, comm, &requests[n++]);
    }
    if (!gpu_) update_rows(2, rows_ - 1);
    MPI_Waitall(n, requests, MPI_STATUSES_IGNORE);
    if (gpu_) {  // the ghost rows up on the copy stream; the update of the boundary rows waits for them
      if (up) copy_async(row(u_, 0), in[0], row_bytes(), cudaMemcpyHostToDevice, copy_);
      if (down) copy_async(row(u_, rows_ + 1), in[1], row_bytes(), cudaMemcpyHostToDevice, copy_);
      cuda_check(cudaEventRecord(halo_, copy_), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(stream_, halo_, 0), "cudaStreamWaitEvent");
    }
    update_rows(1, 1);
    if (rows_ > 1) update_rows(rows_, rows_);
    std::swap(u_, next_);  // the ghost rows of the other array are written before the next step reads them
  }

  // `count` cells of the band, draw `key`: their stencils into x() [count, kInputs], their updates into y().
  void draw(std::uint64_t key, long long count) {
    if (gpu_) return in_situ::sample_cells_cuda(u_, rows_, cols_, key, count, x_, y_, stream_);
    for (long long i = 0; i < count; ++i) in_situ::sample_cell(u_, rows_, cols_, key, i, x_ + i * kInputs, y_ + i);
  }
  float* x() const { return x_; }  // device memory on the GPU
  float* y() const { return y_; }
  // The last draw's `count` samples in host memory, to send them to another process.
  void samples_to_host(long long count, std::vector<float>& x, std::vector<float>& y) const {
    x.resize(static_cast<std::size_t>(count * kInputs));
    y.resize(static_cast<std::size_t>(count));
    if (!gpu_) {
      std::copy(x_, x_ + count * kInputs, x.begin());
      std::copy(y_, y_ + count, y.begin());
      return;
    }
    copy_async(x.data(), x_, x.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_);
    copy_async(y.data(), y_, y.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  // The sum of the band's interior temperatures.
  double heat() const {
    std::vector<float> u(static_cast<std::size_t>((rows_ + 2) * width_));
    if (gpu_) {
      copy_async(u.data(), u_, u.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_);
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    } else {
      std::copy(u_, u_ + u.size(), u.begin());
    }
    double sum = 0;
    for (long long r = 1; r <= rows_; ++r) {
      for (long long c = 1; c <= cols_; ++c) sum += u[static_cast<std::size_t>(r * width_ + c)];
    }
    return sum;
  }
  cudaStream_t stream() const { return stream_; }  // the solver's stream on the GPU; null on the host

 private:
  float* row(float* a, long long r) const { return a + r * width_; }
  std::size_t row_bytes() const { return static_cast<std::size_t>(width_) * sizeof(float); }
  // next = the update of rows [first, last] of u.
  void update_rows(long long first, long long last) {
    if (gpu_) return in_situ::heat_rows_cuda(u_, next_, cols_, first, last, stream_);
    for (long long r = first; r <= last; ++r) {
      for (long long c = 1; c <= cols_; ++c) next_[r * width_ + c] = in_situ::next_value(u_, width_, r, c);
    }
  }

  long long rows_, cols_, width_;
  bool gpu_;
  float *u_ = nullptr, *next_ = nullptr, *x_ = nullptr, *y_ = nullptr;
  std::vector<std::vector<float>> host_;  // the four arrays on the host
  cudaStream_t stream_ = nullptr, copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, halo_ = nullptr;
  float* pinned_ = nullptr;  // two boundary rows out, two ghost rows in
};

// The surrogate and its training: a Session on `comm` (the training ranks), on a stream of its own, so that on
// the GPU the solver's next steps run beside its training; an MLP, DDP, AdamW and a replay buffer on the
// session's device. The errors it scores add up on the device and are read only when reported.
struct Surrogate {
  ddp::Session session;
  ddp::MLP model;
  ddp::DistributedDataParallel data_parallel;
  ddp::AdamW optimizer;
  ddp::data::ReplayBuffer buffer;
  long long batch;
  // Forward, loss and backward of a batch; the step around it is the library's (captured as a CUDA graph on a GPU
  // over NCCL after its first steps).
  ddp::TrainStep step;
  long long draws = 0;
  // This window's sums of squared errors and of squared targets, on the device.
  ddp::Tensor window_err, window_norm;

  Surrogate(MPI_Comm comm, const Flags& f, const Placement& where)
      : session(ddp::communicator(comm), ddp::SessionOptions{.device = where.gpu ? ddp::DeviceRequest::kCuda
                                                                                 : ddp::DeviceRequest::kCpu,
                                                             .backend = f.backend,
                                                             .cuda_device = where.gpu_index}),
        model({kInputs, 64, 64, 1}, ddp::Activation::kTanh, /*seed=*/3, session.device(), session.stream()),
        data_parallel(model, session),
        optimizer(model, {.lr = f.lr}, session.stream()),
        buffer(f.capacity, kInputs, 1, session.device(), session.stream()),
        batch(f.batch),
        step(session, optimizer, [this](const ddp::Tensor& x, const ddp::Tensor& y) {
          ddp::Tensor loss = ddp::ops::mse_loss(model.forward(x, session.stream()), y, session.stream());
          data_parallel.backward(loss);
          return loss;
        }) {
    reset_window();
  }

  // Samples x [n, kInputs] and y [n, 1] (on the session's device, or in host memory when they came from
  // another process): scored by the surrogate, which has not seen them, into the window's sums, then into the
  // replay buffer.
  void take(const ddp::Tensor& x, const ddp::Tensor& y) {
    const ddp::Stream& stream = session.stream();
    const ddp::Tensor dx = x.device() == session.device() ? x : x.copy_to(session.device(), stream);
    const ddp::Tensor dy = y.device() == session.device() ? y : y.copy_to(session.device(), stream);
    const double n = static_cast<double>(dy.numel());
    {
      ddp::autograd::NoGradGuard no_grad;
      const ddp::Tensor zero = ddp::Tensor::zeros(dy.shape(), ddp::DType::kFloat32, session.device(), stream);
      const ddp::Tensor err = ddp::ops::mse_loss(model.forward(dx, stream), dy, stream);
      const ddp::Tensor norm = ddp::ops::mse_loss(dy, zero, stream);
      window_err = ddp::ops::add(window_err, ddp::ops::scale(err, n, stream), stream);
      window_norm = ddp::ops::add(window_norm, ddp::ops::scale(norm, n, stream), stream);
    }
    buffer.add(dx, dy, stream);
  }
  // The window's sums (error, norm), read back, and a new window begun.
  std::pair<double, double> read_window() {
    const std::pair<double, double> sums{window_err.item(session.stream()), window_norm.item(session.stream())};
    reset_window();
    return sums;
  }
  void reset_window() {
    window_err = ddp::Tensor::zeros({}, ddp::DType::kFloat32, session.device(), session.stream());
    window_norm = ddp::Tensor::zeros({}, ddp::DType::kFloat32, session.device(), session.stream());
  }

  // Training steps on batches drawn from the replay buffer into the step's buffers, on the device.
  void train(long long steps) {
    const ddp::Stream& stream = session.stream();
    for (long long s = 0; s < steps; ++s) {
      step.fill_and_step(batch, kInputs, 1, [&](const ddp::Tensor& x, const ddp::Tensor& y) {
        buffer.sample(11 + session.rank(), draws++, x, y, stream);
      });
    }
  }
};

ddp::Tensor host_rows(std::vector<float>& v, long long width) {
  return ddp::Tensor::from_blob(v.data(), {static_cast<long long>(v.size()) / width, width}, ddp::DType::kFloat32,
                                ddp::Device::cpu());
}

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--layout", f.layout, "all: every rank simulates and trains; split: simulation and training ranks")
      ->check(CLI::IsMember({"all", "split"}));
  app.add_option("--device", f.device,
                 "where the solver and the surrogate run: auto (the GPUs where each rank has its own), cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--backend", f.backend, "gradient backend: auto, nccl or mpi")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--rows", f.rows, "interior rows of the plate")->check(CLI::Range(1, 1 << 20));
  app.add_option("--cols", f.cols, "interior columns")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", f.steps, "solver steps")->check(CLI::Range(1LL, 1LL << 40));
  app.add_option("--sample-every", f.sample_every, "solver steps between samples")->check(CLI::Range(1, 1 << 20));
  app.add_option("--samples", f.samples, "cells sampled per simulation rank each time")->check(CLI::Range(1, 1 << 20));
  app.add_option("--train-steps", f.train_steps, "training steps per round of samples")->check(CLI::Range(0, 1 << 20));
  app.add_option("--batch", f.batch, "training batch per rank")->check(CLI::Range(1, 1 << 20));
  app.add_option("--capacity", f.capacity, "replay buffer samples per training rank")->check(CLI::Range(1, 1 << 26));
  app.add_option("--lr", f.lr, "AdamW learning rate");
  app.add_option("--max-error", f.max_error, "exit 1 unless the final relative error is below this");
  app.add_option("--log-every", f.log_every, "solver steps between printed errors")->check(CLI::Range(1LL, 1LL << 40));
  app.add_option("--training-thread", f.training_thread,
                 "where a rank simulates and trains, its training rounds on a thread of their own: auto (on the GPU), "
                 "on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
}

// Which ranks simulate and which train: all of them both, or (split) the first half rounded up simulating and
// the rest training. Never more training ranks than simulation ranks: each training rank is fed by at least one
// (on 3 ranks, 2 simulate and 1 trains).
struct Roles {
  Roles(bool split, int rank, int size)
      : split(split),
        rank(rank),
        size(size),
        sims(split ? (size + 1) / 2 : size),
        trainers(split ? size - sims : size),
        simulates(!split || rank < sims),
        trains(!split || rank >= sims) {}
  bool split;
  int rank, size, sims, trainers;
  bool simulates, trains;
};

// Why the job cannot run as asked (said by rank 0), or "" when it can.
std::string refusal(const Flags& f, const Roles& roles) {
  if (roles.split && roles.size < 2) return "--layout split needs at least 2 ranks";
  if (f.rows < roles.sims) {
    return std::to_string(f.rows) + " rows give some of the " + std::to_string(roles.sims) +
           " simulation ranks no row";
  }
  // Each simulation rank holds its band three times on the host (its start, the state and the next one): a plate
  // too large for this node is refused here, once, with its size, instead of as an out-of-memory on every rank.
  const double band_bytes =
      double((f.rows + roles.sims - 1) / roles.sims + 2) * double(f.cols + 2) * sizeof(float) * 3;
  const double node_bytes = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  const int ranks_here = std::max(1, [] {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    return local != nullptr ? std::atoi(local) : 1;
  }());
  if (node_bytes > 0 && band_bytes * ranks_here > node_bytes) {
    char text[512];
    std::snprintf(text, sizeof text, "a %lld x %lld plate gives each of the %d simulation ranks a band needing "
                  "%.3g GiB of host memory (its state held 3 times in float32), %.3g GiB for the %d ranks on this "
                  "node, which has %.3g GiB: choose smaller --rows and --cols",
                  f.rows, f.cols, roles.sims, band_bytes / (1 << 30), band_bytes * ranks_here / (1 << 30),
                  ranks_here, node_bytes / (1 << 30));
    return text;
  }
  return "";
}

// The solver and the surrogate of one rank (each where its role has it), and the rounds that join them.
class InSituJob {
 public:
  // `threads`: MPI allows calls from several threads (--training-thread auto then runs the training rounds on a
  // thread of their own where one GPU both simulates and trains).
  InSituJob(const Flags& f, const Roles& roles, const Placement& where, bool threads) : f_(f), roles_(roles) {
    MPI_Comm_split(MPI_COMM_WORLD, roles.simulates ? 0 : MPI_UNDEFINED, roles.rank, &sim_comm_);
    MPI_Comm_split(MPI_COMM_WORLD, roles.trains ? 0 : MPI_UNDEFINED, roles.rank, &train_comm_);
    if (roles.simulates) {
      MPI_Comm_rank(sim_comm_, &sim_rank_);
      const long long base = f.rows / roles.sims, extra = f.rows % roles.sims;
      const long long begin = sim_rank_ * base + std::min<long long>(sim_rank_, extra);
      band_ = std::make_unique<Band>(begin, base + (sim_rank_ < extra ? 1 : 0), f.cols, f.rows, f.samples, where.gpu);
    }
    if (roles.trains) surrogate_ = std::make_unique<Surrogate>(train_comm_, f, where);
    if (band_ && surrogate_ && where.gpu) {
      const ddp::Device& device = surrogate_->session.device();
      solver_ = ddp::Stream::borrow(device, band_->stream());
      drawn_ = ddp::Event::create(device);
      taken_ = ddp::Event::create(device);
    }
    const bool thread = f.training_thread == "on" || (f.training_thread == "auto" && where.gpu && threads);
    if (band_ && surrogate_ && thread) {
      training_ = std::make_unique<in_situ::TrainingThread>(
          [this, where](long long) {
            if (where.gpu) cuda_check(cudaSetDevice(where.gpu_index), "cudaSetDevice");  // a thread's own setting
            const ddp::StreamGuard on(surrogate_->session.stream());
            exchange_samples();
          },
          [this](long long s) {
            const ddp::StreamGuard on(surrogate_->session.stream());
            train_round(s);
          });
    }
  }
  ~InSituJob() {
    training_.reset();  // first: its rounds use the surrogate and the band
    surrogate_.reset();  // before the band: training reads the band's samples in place
    band_.reset();
    if (sim_comm_ != MPI_COMM_NULL) MPI_Comm_free(&sim_comm_);
    if (train_comm_ != MPI_COMM_NULL) MPI_Comm_free(&train_comm_);
  }
  InSituJob(const InSituJob&) = delete;
  InSituJob& operator=(const InSituJob&) = delete;

  // Solver step `s`, and on a sampling step the samples taken and trained on; the error printed every
  // --log-every steps. Where one GPU both simulates and trains, the two streams hand the samples over by events
  // (the training waits for the draw, the next draw for the training to have taken them), and the training
  // rounds run on their own thread where MPI allows it, so neither the solver's thread nor its stream waits for
  // the training steps.
  void step(long long s) {
    if (roles_.simulates) band_->step(sim_comm_, sim_rank_, roles_.sims);
    if (s % f_.sample_every != 0) return;
    const std::uint64_t key = in_situ::mix(static_cast<std::uint64_t>(1000 + roles_.rank) * 0x100000001B3ULL + s);
    if (roles_.simulates) {
      if (training_) training_->wait_taken();  // the last round's event recorded: the wait below is on it
      taken_.wait(solver_);
      band_->draw(key, f_.samples);
      drawn_.record(solver_);
    }
    if (training_) return training_->hand_over(s);
    exchange_samples();
    train_round(s);
  }
  // Waits for the training ranks' last steps (the time of a run includes them).
  void finish() {
    if (training_) training_->wait_done();
    if (roles_.trains) surrogate_->session.stream().synchronize();
  }
  // The plate's heat and the training ranks' last error, the same on every rank.
  std::pair<double, double> verdict() {
    double heat = roles_.simulates ? band_->heat() : 0.0;
    MPI_Allreduce(MPI_IN_PLACE, &heat, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double final_error = roles_.trains ? last_ : 0.0;
    MPI_Allreduce(MPI_IN_PLACE, &final_error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return {heat, final_error};
  }

 private:
  // The samples of this round from the simulation ranks to the training ranks; a training rank's surrogate
  // scores them before it stores them.
  void exchange_samples() {
    if (!roles_.split) {
      // The samples where the solver drew them: device arrays on the GPU, read in place by training.
      const ddp::Device& device = surrogate_->session.device();
      const ddp::Stream& training = surrogate_->session.stream();
      drawn_.wait(training);
      surrogate_->take(ddp::Tensor::from_blob(band_->x(), {f_.samples, kInputs}, ddp::DType::kFloat32, device),
                       ddp::Tensor::from_blob(band_->y(), {f_.samples, 1}, ddp::DType::kFloat32, device));
      taken_.record(training);
      return;
    }
    if (roles_.simulates) {
      // Simulation rank k sends its samples to training rank k % trainers (world rank sims + k % trainers).
      band_->samples_to_host(f_.samples, x_, y_);
      const int to = roles_.sims + sim_rank_ % roles_.trainers;
      MPI_Send(x_.data(), static_cast<int>(x_.size()), MPI_FLOAT, to, 10, MPI_COMM_WORLD);
      MPI_Send(y_.data(), static_cast<int>(y_.size()), MPI_FLOAT, to, 11, MPI_COMM_WORLD);
      return;
    }
    // This training rank's shard: the simulation ranks k with k % trainers == its own index.
    x_.clear();
    y_.clear();
    std::vector<float> kx(f_.samples * kInputs), ky(f_.samples);
    for (int k = roles_.rank - roles_.sims; k < roles_.sims; k += roles_.trainers) {
      MPI_Recv(kx.data(), static_cast<int>(kx.size()), MPI_FLOAT, k, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Recv(ky.data(), static_cast<int>(ky.size()), MPI_FLOAT, k, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      x_.insert(x_.end(), kx.begin(), kx.end());
      y_.insert(y_.end(), ky.begin(), ky.end());
    }
    if (!y_.empty()) surrogate_->take(host_rows(x_, kInputs), host_rows(y_, 1));
  }
  // The training of sampling step `s` on the samples taken, and the report when `s` is a log step.
  void train_round(long long s) {
    if (!roles_.trains) return;
    surrogate_->train(f_.train_steps);
    if (s % f_.log_every == 0 || s == f_.steps) report(s);
  }
  void report(long long s) {
    const auto [err, norm] = surrogate_->read_window();
    const std::vector<double> sums = surrogate_->session.sum(std::vector<double>{err, norm});
    last_ = std::sqrt(sums[0] / std::max(sums[1], 1e-30));
    if (surrogate_->session.is_lead()) std::printf("step %lld surrogate_rel_error %.4f\n", s, last_);
    std::fflush(stdout);
  }

  const Flags& f_;
  const Roles& roles_;
  MPI_Comm sim_comm_ = MPI_COMM_NULL, train_comm_ = MPI_COMM_NULL;
  int sim_rank_ = -1;
  std::unique_ptr<Band> band_;
  std::unique_ptr<Surrogate> surrogate_;
  // Where one GPU simulates and trains: the solver's stream as the runtime takes it, the hand-over events, and
  // the training rounds' thread.
  ddp::Stream solver_;
  ddp::Event drawn_, taken_;
  std::unique_ptr<in_situ::TrainingThread> training_;
  std::vector<float> x_, y_;
  double last_ = 1.0;
};

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"in_situ_surrogate: a heat solver that trains a surrogate of itself as it runs"};
  add_flags(app, f);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }
  const Roles roles(f.layout == "split", rank, size);
  if (const std::string why = refusal(f, roles); !why.empty()) {
    if (rank == 0) std::fprintf(stderr, "in_situ_surrogate: %s\n", why.c_str());
    return 2;
  }
  Placement where;
  try {
    where = place(f.device, MPI_COMM_WORLD);
  } catch (const std::invalid_argument& e) {
    if (rank == 0) std::fprintf(stderr, "in_situ_surrogate: %s\n", e.what());
    return 2;
  }
  int threading = MPI_THREAD_SINGLE;
  MPI_Query_thread(&threading);
  if (f.training_thread == "on" && threading != MPI_THREAD_MULTIPLE) {
    if (rank == 0) std::fprintf(stderr, "in_situ_surrogate: --training-thread on needs MPI_THREAD_MULTIPLE, which "
                                        "this MPI does not provide: use --training-thread off\n");
    return 2;
  }
  InSituJob job(f, roles, where, threading == MPI_THREAD_MULTIPLE);
  if (rank == 0) {
    std::printf("in_situ_surrogate: layout=%s ranks=%d simulation=%d training=%d plate=%lldx%lld steps=%lld "
                "device=%s replay_buffer=%lld samples (%lld KiB) per training rank\n",
                f.layout.c_str(), size, roles.sims, roles.trainers, f.rows, f.cols, f.steps,
                where.gpu ? "cuda" : "cpu", f.capacity, f.capacity * (kInputs + 1) * 4 / 1024);
  }
  // The solver's pace, training included: from every rank at the start to every rank done.
  MPI_Barrier(MPI_COMM_WORLD);
  const double begin = MPI_Wtime();
  for (long long s = 1; s <= f.steps; ++s) job.step(s);
  job.finish();
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = MPI_Wtime() - begin;
  const auto [heat, final_error] = job.verdict();
  if (rank == 0) {
    std::printf("solver_steps_per_s=%.1f (%lld steps in %.3f s)\n", double(f.steps) / seconds, f.steps, seconds);
    std::printf("plate_heat=%.10g\n", heat);
    std::printf("final_rel_error=%.4f (bound %.4f)\n", final_error, f.max_error);
  }
  return final_error < f.max_error ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the application owns MPI
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "in_situ_surrogate: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
