// An MPI simulation that trains a surrogate of itself while it runs: the seed's halo exchange grown into the
// pattern TorchFort is used for, on the runtime embedded through the application's communicator (ddp_mpi.h).
//
// The solver: nonlinear heat diffusion on a plate split by rows across the simulation ranks,
//   u' = u + r · (0.5 + u²) · (up + down + left + right − 4u),
// the top edge hot, the other edges cold, random hot spots inside. Each step overlaps the halo exchange with
// the interior update: the boundary rows go out and the ghost rows come in by nonblocking MPI on the
// application's own communicator while the rows that need no ghost row are updated; then the two boundary rows.
// The surrogate: an MLP from a cell's 5-point stencil (u and its neighbours' differences from u) to its update
// (u' − u) / r,
// learned online from the solver's states as they come: every --sample-every steps each simulation rank draws
// --samples cells of its band and hands them to training, whose replay buffer (a fixed bound per rank) they
// enter after the surrogate was scored on them, unseen: the printed error is on states it never trained on.
//
// Layouts (--layout):
//   all    every rank simulates its band and trains on its own samples; gradients averaged over all ranks.
//   split  the world split in two: the first half simulates (its own communicator for the halos) and sends
//          samples to the second half, which trains (a Session on the training ranks' communicator only).
//
//   mpirun -np 4 bazel-bin/examples/in_situ_surrogate --layout split [--steps 600] [--rows 64] [--cols 64]
// Prints `step S surrogate_rel_error E` as it goes and `final_rel_error=E`; exits 1 unless E < --max-error.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ddp_mpi.h"

namespace {

constexpr int kInputs = 5;
constexpr double kRate = 0.15;
constexpr float kScale = 20.0f;  // differences between neighbouring cells are a few hundredths

struct Flags {
  std::string layout = "all";
  std::string device = "cpu", backend = "auto";
  long long rows = 64, cols = 64, steps = 600;
  long long sample_every = 5, samples = 256, train_steps = 12, batch = 256, capacity = 8192;
  double lr = 2e-3, max_error = 0.35;
  long long log_every = 100;
};

// One band of the plate: rows [begin, end) of the interior, with a ghost row above and below.
struct Band {
  long long begin = 0, rows = 0, cols = 0;
  std::vector<float> u, next;  // (rows + 2) x (cols + 2)
  float& at(std::vector<float>& v, long long r, long long c) { return v[r * (cols + 2) + c]; }
};

float update(float u, float up, float down, float left, float right) {
  return static_cast<float>((0.5 + double(u) * u) * (double(up) + down + left + right - 4.0 * u));
}

void initialise(Band& b, long long total_rows) {
  b.u.assign((b.rows + 2) * (b.cols + 2), 0.0f);
  for (long long r = 0; r < b.rows + 2; ++r) {
    for (long long c = 0; c < b.cols + 2; ++c) {
      const long long g = b.begin + r;  // global row, 0 = the hot top edge
      const double y = double(g) / total_rows, x = double(c) / (b.cols + 1);
      float v = g == 0 ? 1.0f : 0.0f;
      if (g > 0 && c > 0 && c < b.cols + 1 && g < total_rows + 1) {
        v = static_cast<float>(0.9 * std::exp(-40 * ((x - 0.3) * (x - 0.3) + (y - 0.6) * (y - 0.6))) +
                               0.7 * std::exp(-60 * ((x - 0.75) * (x - 0.75) + (y - 0.3) * (y - 0.3))));
      }
      b.at(b.u, r, c) = v;
    }
  }
  b.next = b.u;
}

// One solver step on `comm` (the simulation ranks): halos in flight while the interior rows are updated.
void step(Band& b, MPI_Comm comm, int rank, int size) {
  MPI_Request requests[4];
  int n = 0;
  const int width = static_cast<int>(b.cols + 2);
  if (rank > 0) {
    MPI_Irecv(&b.at(b.u, 0, 0), width, MPI_FLOAT, rank - 1, 1, comm, &requests[n++]);
    MPI_Isend(&b.at(b.u, 1, 0), width, MPI_FLOAT, rank - 1, 2, comm, &requests[n++]);
  }
  if (rank < size - 1) {
    MPI_Irecv(&b.at(b.u, b.rows + 1, 0), width, MPI_FLOAT, rank + 1, 2, comm, &requests[n++]);
    MPI_Isend(&b.at(b.u, b.rows, 0), width, MPI_FLOAT, rank + 1, 1, comm, &requests[n++]);
  }
  auto row = [&](long long r) {
    for (long long c = 1; c <= b.cols; ++c) {
      const float u = b.at(b.u, r, c);
      b.at(b.next, r, c) = u + static_cast<float>(kRate) * update(u, b.at(b.u, r - 1, c), b.at(b.u, r + 1, c),
                                                                   b.at(b.u, r, c - 1), b.at(b.u, r, c + 1));
    }
  };
  for (long long r = 2; r < b.rows; ++r) row(r);
  MPI_Waitall(n, requests, MPI_STATUSES_IGNORE);
  row(1);
  if (b.rows > 1) row(b.rows);
  // The ghost rows and the fixed edges carry over; the interior takes the new values.
  for (long long r = 1; r <= b.rows; ++r) {
    std::copy(&b.at(b.next, r, 1), &b.at(b.next, r, 1) + b.cols, &b.at(b.u, r, 1));
  }
}

// `count` cells of the band at random: their stencils and the solver's update.
void draw_samples(Band& b, std::mt19937_64& rng, long long count, std::vector<float>& x, std::vector<float>& y) {
  x.resize(count * kInputs);
  y.resize(count);
  std::uniform_int_distribution<long long> row(1, b.rows), col(1, b.cols);
  for (long long i = 0; i < count; ++i) {
    const long long r = row(rng), c = col(rng);
    const float u = b.at(b.u, r, c), up = b.at(b.u, r - 1, c), down = b.at(b.u, r + 1, c);
    const float left = b.at(b.u, r, c - 1), right = b.at(b.u, r, c + 1);
    // Features on the scale of the changes: the value and its neighbours' differences from it, magnified.
    float* s = &x[i * kInputs];
    s[0] = u;
    s[1] = kScale * (up - u);
    s[2] = kScale * (down - u);
    s[3] = kScale * (left - u);
    s[4] = kScale * (right - u);
    y[i] = kScale * update(u, up, down, left, right);
  }
}

// The surrogate and its training: a Session on `comm` (the training ranks), an MLP, DDP and AdamW.
struct Surrogate {
  ddp::Session session;
  ddp::MLP model;
  ddp::DistributedDataParallel data_parallel;
  ddp::AdamW optimizer;
  ddp::data::ReplayBuffer buffer;
  std::vector<float> bx, by, prediction;
  long long draws = 0;

  Surrogate(MPI_Comm comm, const Flags& f)
      : session(ddp::communicator(comm),
                ddp::SessionOptions{.device = ddp::parse_device_request(f.device), .backend = f.backend}),
        model({kInputs, 64, 64, 1}, ddp::Activation::kTanh, /*seed=*/3, session.device(), session.stream()),
        data_parallel(model, session),
        optimizer(model, {.lr = f.lr}, session.stream()),
        buffer(f.capacity, kInputs, 1),
        bx(f.batch * kInputs),
        by(f.batch) {}

  // The host samples as a tensor of the session's device: read in place on the CPU, copied to a GPU (the
  // solver here runs on the host).
  ddp::Tensor on_device(float* data, long long rows, long long cols) const {
    if (session.device().is_cpu()) return ddp::Tensor::from_blob(data, {rows, cols}, ddp::DType::kFloat32, session.device());
    return ddp::Tensor::from_host(data, {rows, cols}, ddp::DType::kFloat32, session.device(), session.stream());
  }

  // Sum of squared errors and of squared targets on samples the surrogate has not seen, then they enter.
  std::pair<double, double> take(std::vector<float>& x, std::vector<float>& y) {
    const long long n = static_cast<long long>(y.size());
    prediction.resize(n);
    {
      ddp::autograd::NoGradGuard no_grad;
      const ddp::Stream& stream = session.stream();
      const ddp::Tensor in = on_device(x.data(), n, kInputs);
      ddp::Tensor out = ddp::Tensor::from_blob(prediction.data(), {n, 1}, ddp::DType::kFloat32, ddp::Device::cpu());
      out.copy_from(model.forward(in, stream), stream);
      stream.synchronize();
    }
    double err = 0, norm = 0;
    for (long long i = 0; i < n; ++i) {
      err += (prediction[i] - y[i]) * double(prediction[i] - y[i]);
      norm += double(y[i]) * y[i];
    }
    buffer.add(x.data(), y.data(), n);
    return {err, norm};
  }

  // Training steps on batches of the replay buffer, read in place (Tensor::from_blob: no copy on the CPU).
  void train(long long steps, long long batch) {
    const ddp::Stream& stream = session.stream();
    for (long long s = 0; s < steps; ++s) {
      buffer.sample(batch, 11 + session.rank(), draws++, bx.data(), by.data());
      const ddp::Tensor x = on_device(bx.data(), batch, kInputs);
      const ddp::Tensor y = on_device(by.data(), batch, 1);
      model.zero_grad(stream);
      data_parallel.backward(ddp::ops::mse_loss(model.forward(x, stream), y, stream));
      optimizer.step(stream);
    }
    stream.synchronize();
  }
};

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"in_situ_surrogate: a heat solver that trains a surrogate of itself as it runs"};
  app.add_option("--layout", f.layout, "all: every rank simulates and trains; split: simulation and training ranks")
      ->check(CLI::IsMember({"all", "split"}));
  app.add_option("--device", f.device, "where the surrogate trains: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--backend", f.backend, "gradient backend: auto, nccl or mpi")->check(CLI::IsMember({"auto", "nccl", "mpi"}));
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
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }
  const bool split = f.layout == "split";
  if (split && size < 2) {
    if (rank == 0) std::fprintf(stderr, "in_situ_surrogate: --layout split needs at least 2 ranks\n");
    return 2;
  }
  // Simulation ranks: all, or the first half; training ranks: all, or the second half.
  const int sims = split ? size / 2 : size, trainers = split ? size - sims : size;
  const bool simulates = !split || rank < sims, trains = !split || rank >= sims;
  if (f.rows < sims) {
    if (rank == 0) std::fprintf(stderr, "in_situ_surrogate: %lld rows give some of the %d simulation ranks no row\n", f.rows, sims);
    return 2;
  }
  MPI_Comm sim_comm = MPI_COMM_NULL, train_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, simulates ? 0 : MPI_UNDEFINED, rank, &sim_comm);
  MPI_Comm_split(MPI_COMM_WORLD, trains ? 0 : MPI_UNDEFINED, rank, &train_comm);

  Band band;
  std::mt19937_64 rng(1000 + rank);
  int sim_rank = -1;
  if (simulates) {
    MPI_Comm_rank(sim_comm, &sim_rank);
    const long long base = f.rows / sims, extra = f.rows % sims;
    band.rows = base + (sim_rank < extra ? 1 : 0);
    band.begin = sim_rank * base + std::min<long long>(sim_rank, extra);
    band.cols = f.cols;
    initialise(band, f.rows);
  }
  std::unique_ptr<Surrogate> surrogate;
  if (trains) surrogate = std::make_unique<Surrogate>(train_comm, f);
  if (rank == 0) {
    std::printf("in_situ_surrogate: layout=%s ranks=%d simulation=%d training=%d plate=%lldx%lld steps=%lld "
                "replay_buffer=%lld samples (%lld KiB) per training rank\n",
                f.layout.c_str(), size, sims, trainers, f.rows, f.cols, f.steps, f.capacity,
                f.capacity * (kInputs + 1) * 4 / 1024);
  }

  std::vector<float> x, y;
  double window_err = 0, window_norm = 0, last = 1.0;
  for (long long s = 1; s <= f.steps; ++s) {
    if (simulates) step(band, sim_comm, sim_rank, sims);
    if (s % f.sample_every != 0) continue;
    if (!split) {
      draw_samples(band, rng, f.samples, x, y);
    } else if (simulates) {
      // Simulation rank k sends its samples to training rank k % trainers (world rank sims + k % trainers).
      draw_samples(band, rng, f.samples, x, y);
      const int to = sims + sim_rank % trainers;
      MPI_Send(x.data(), static_cast<int>(x.size()), MPI_FLOAT, to, 10, MPI_COMM_WORLD);
      MPI_Send(y.data(), static_cast<int>(y.size()), MPI_FLOAT, to, 11, MPI_COMM_WORLD);
    }
    if (trains) {
      if (split) {
        // This training rank's shard: the simulation ranks k with k % trainers == its own index.
        x.clear();
        y.clear();
        for (int k = rank - sims; k < sims; k += trainers) {
          std::vector<float> kx(f.samples * kInputs), ky(f.samples);
          MPI_Recv(kx.data(), static_cast<int>(kx.size()), MPI_FLOAT, k, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Recv(ky.data(), static_cast<int>(ky.size()), MPI_FLOAT, k, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          x.insert(x.end(), kx.begin(), kx.end());
          y.insert(y.end(), ky.begin(), ky.end());
        }
      }
      if (!y.empty()) {
        const auto [err, norm] = surrogate->take(x, y);
        window_err += err;
        window_norm += norm;
      }
      surrogate->train(f.train_steps, f.batch);  // the next batch is drawn only after this one's step is done
    }
    if (s % f.log_every == 0 || s == f.steps) {
      if (trains) {
        const std::vector<double> sums = surrogate->session.sum(std::vector<double>{window_err, window_norm});
        last = std::sqrt(sums[0] / std::max(sums[1], 1e-30));
        if (surrogate->session.is_lead()) std::printf("step %lld surrogate_rel_error %.4f\n", s, last);
        std::fflush(stdout);
      }
      window_err = window_norm = 0;
    }
  }
  // The training ranks' verdict, to every rank.
  double final_error = trains ? last : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &final_error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("final_rel_error=%.4f (bound %.4f)\n", final_error, f.max_error);
  surrogate.reset();
  if (sim_comm != MPI_COMM_NULL) MPI_Comm_free(&sim_comm);
  if (train_comm != MPI_COMM_NULL) MPI_Comm_free(&train_comm);
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
