// Heat diffusion on a plate split across ranks: the seed's other program, a two-stream halo exchange, on the
// public API.
//
// The plate is a grid of (rows + 2) x (cols + 2) cells whose outer ring is held fixed (the top edge hot, the
// others cold) around a hot square in the middle; each step is the explicit five-point update
//   u' = u + r · (up + down + left + right − 4u)       (r = --rate ≤ 0.25 for stability)
// Rank k owns a band of rows plus one ghost row above and below, which hold its neighbours' boundary rows. A
// step overlaps communication with computation on two streams of the rank's device:
//   * the communication stream, once the previous step is done, sends the band's first and last rows to the
//     neighbours and receives their rows into the ghost rows (ProcessGroup::send_recv: NCCL on GPUs; MPI on
//     CPUs, and on GPUs through pinned host memory: the boundary goes device-to-host and back);
//   * meanwhile the compute stream updates the rows that need no ghost row;
//   * then the compute stream waits for the exchange (an Event, no host synchronisation on GPUs) and updates
//     the two boundary rows.
// Every rank also computes the whole plate alone, the one-rank result, and compares its band with it: the
// update is elementwise and rounded the same way on every device, so they must be equal bit for bit. Rank 0
// prints the plate's total heat every --log-every steps and `max_abs_diff=<d>`; the exit status is non-zero
// unless d is 0.
//
//   mpirun -np 4 bazel-bin/examples/halo_exchange [--device auto|cpu|cuda] [--backend nccl|mpi] [--rows 256] ...
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp.h"
#include "examples/cli_checks.h"

namespace halo {

using ddp::Stream;
using ddp::Tensor;

struct Flags {
  ddp::DeviceRequest device = ddp::DeviceRequest::kAuto;
  std::string backend = "auto";
  long long rows = 256;  // interior rows of the plate, split across the ranks
  long long cols = 256;  // interior columns
  long long steps = 200;
  double rate = 0.2;
  long long log_every = 50;
  bool check = true;
};

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv) {
  Flags f;
  std::string device = "auto";
  CLI::App app{"Heat diffusion on a plate split across ranks, with a two-stream halo exchange (under mpirun)."};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--backend", f.backend, "auto, nccl or mpi")->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--rows", f.rows, "interior rows, split across the ranks")->check(CLI::Range(1, 1 << 20));
  app.add_option("--cols", f.cols, "interior columns")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", f.steps, "time steps")->check(CLI::Range(0, 1 << 24));
  app.add_option("--rate", f.rate, "r of the update, at most 0.25 for stability")->check(CLI::Range(1e-6, 0.25));
  app.add_option("--log-every", f.log_every, "steps between heat lines")->check(CLI::Range(1, 1 << 24));
  app.add_flag("!--no-check", f.check, "skip the comparison with the one-rank result");
  examples::parse_or_throw(app, argc, argv);
  f.device = ddp::parse_device_request(device);
  return f;
}

// A block of plate rows with one ghost row above and one below: rows [first, first + rows) of the plate's
// interior (1-based plate rows; plate rows 0 and total + 1 are the fixed edges) in local rows 1..rows.
struct Band {
  long long first = 1;
  long long rows = 0;
  long long width = 0;  // cols + 2
  Tensor u, v;          // [(rows + 2) · width] float32: the current and the next temperatures
  Tensor rate_mask;     // r on updated cells, 0 on the fixed left and right edges
};

// The initial temperatures of plate rows [first - 1, first + rows + 1): a hot top edge and a hot square.
std::vector<float> initial_rows(const Flags& f, long long first, long long rows) {
  const long long width = f.cols + 2;
  std::vector<float> values(static_cast<std::size_t>((rows + 2) * width), 0.0f);
  for (long long local = 0; local < rows + 2; ++local) {
    const long long row = first - 1 + local;
    for (long long col = 0; col < width; ++col) {
      const bool top_edge = row == 0;
      const bool square =
          std::llabs(2 * row - (f.rows + 1)) < f.rows / 2 && std::llabs(2 * col - (f.cols + 1)) < f.cols / 2;
      values[static_cast<std::size_t>(local * width + col)] = top_edge || square ? 1.0f : 0.0f;
    }
  }
  return values;
}

Band make_band(const Flags& f, long long first, long long rows, const ddp::Session& session) {
  Band b{first, rows, f.cols + 2};
  const ddp::Shape shape = {(rows + 2) * b.width};
  b.u = Tensor::from_vector(initial_rows(f, first, rows), shape, session.device(), session.stream());
  b.v = b.u.clone(session.stream());  // the fixed edges and ghost rows start equal in both
  std::vector<float> mask(static_cast<std::size_t>(shape[0]), static_cast<float>(f.rate));
  for (long long r = 0; r < rows + 2; ++r) {
    mask[static_cast<std::size_t>(r * b.width)] = 0.0f;
    mask[static_cast<std::size_t>(r * b.width + b.width - 1)] = 0.0f;
  }
  b.rate_mask = Tensor::from_vector(mask, shape, session.device(), session.stream());
  return b;
}

// Local rows [a, b) of band.v from band.u, on `stream`: whole rows as flat slices, the left and right
// neighbours one element over (the edge columns, whose rate is 0, keep their value).
void update_rows(Band& band, long long a, long long b, const Stream& stream) {
  if (a >= b) return;
  using ddp::ops::add;
  const long long w = band.width, n = (b - a) * w;
  auto at = [&](const Tensor& t, long long offset) { return t.flat_slice(offset, {n}); };
  const Tensor center = at(band.u, a * w);
  const Tensor neighbours = add(add(at(band.u, (a - 1) * w), at(band.u, (a + 1) * w), stream),
                                add(at(band.u, a * w - 1), at(band.u, a * w + 1), stream), stream);
  const Tensor laplacian = add(neighbours, ddp::ops::scale(center, -4.0, stream), stream);
  at(band.v, a * w).copy_from(add(center, ddp::ops::mul(at(band.rate_mask, a * w), laplacian, stream), stream), stream);
}

// The band's rows [first, first + rows) split evenly: rank k of n gets rows/n, the first rows % n one more.
std::pair<long long, long long> my_rows(const Flags& f, int rank, int ranks) {
  const long long base = f.rows / ranks, extra = f.rows % ranks;
  return {1 + rank * base + std::min<long long>(rank, extra), base + (rank < extra ? 1 : 0)};
}

// One step of the distributed plate (see the top of this file).
class HaloStep {
 public:
  HaloStep(ddp::Session& session, Band& band)
      : session_(session), band_(band), comm_(Stream::create(session.device())),
        step_done_(ddp::Event::create(session.device())), halo_done_(ddp::Event::create(session.device())) {
    up_ = session.rank() > 0 ? session.rank() - 1 : -1;
    down_ = session.rank() + 1 < session.size() ? session.rank() + 1 : -1;
  }

  void operator()() {
    const Stream& compute = session_.stream();
    const long long n = band_.rows, w = band_.width;
    step_done_.record(compute);
    step_done_.wait(comm_);  // the rows to send are the previous step's result
    auto row = [&](long long r) { return ddp::CommBuffer::of(band_.u.flat_slice(r * w, {w})); };
    std::vector<ddp::PeerBuffer> sends, recvs;
    if (up_ >= 0) {
      sends.push_back({row(1), up_});
      recvs.push_back({row(0), up_});
    }
    if (down_ >= 0) {
      sends.push_back({row(n), down_});
      recvs.push_back({row(n + 1), down_});
    }
    auto exchange = session_.group().send_recv(sends, recvs, comm_);
    update_rows(band_, 2, n, compute);  // rows that need no ghost row, while the boundary travels
    exchange->wait(comm_);
    halo_done_.record(comm_);
    halo_done_.wait(compute);
    update_rows(band_, 1, std::min(2LL, n + 1), compute);
    update_rows(band_, std::max(2LL, n), n + 1, compute);
    std::swap(band_.u, band_.v);
  }

 private:
  ddp::Session& session_;
  Band& band_;
  Stream comm_;
  ddp::Event step_done_, halo_done_;
  int up_ = -1, down_ = -1;
};

// The band's total heat (its own rows), summed over ranks: every rank calls it.
double total_heat(const Band& band, const ddp::Session& session) {
  const std::vector<float> values = band.u.to_vector<float>(session.stream());
  double sum = 0;
  for (long long r = 1; r <= band.rows; ++r)
    for (long long c = 0; c < band.width; ++c) sum += values[static_cast<std::size_t>(r * band.width + c)];
  return session.sum(sum);
}

// The largest difference between the band and the same rows of the one-rank result.
double difference_from_one_rank(const Flags& f, const Band& band, const ddp::Session& session) {
  ddp::autograd::NoGradGuard no_grad;
  Band whole = make_band(f, 1, f.rows, session);
  for (long long s = 0; s < f.steps; ++s) {
    update_rows(whole, 1, f.rows + 1, session.stream());
    std::swap(whole.u, whole.v);
  }
  const std::vector<float> mine = band.u.to_vector<float>(session.stream());
  const std::vector<float> all = whole.u.to_vector<float>(session.stream());
  double worst = 0;
  for (long long r = 1; r <= band.rows; ++r) {
    for (long long c = 0; c < band.width; ++c) {
      const float got = mine[static_cast<std::size_t>(r * band.width + c)];
      const float want = all[static_cast<std::size_t>((band.first - 1 + r) * band.width + c)];
      worst = std::max(worst, got == want ? 0.0 : std::isnan(got) ? INFINITY : std::fabs(got - want));
    }
  }
  return session.max(worst);
}

int run(int argc, char** argv) {
  auto [flags, flag_error] = examples::parse_now_report_later<Flags>([&] { return parse_flags(argc, argv); });
  ddp::SessionOptions options;
  options.device = flags.device;
  options.backend = flags.backend;
  ddp::Session session(&argc, &argv, options);
  if (flag_error.empty() && flags.rows < session.size()) {
    flag_error = "--rows " + std::to_string(flags.rows) + " gives some of the " + std::to_string(session.size()) +
                 " ranks no row; use at least as many rows as ranks";
  }
  session.agree(flag_error, "bad command line");

  ddp::autograd::NoGradGuard no_grad;
  const auto [first, rows] = my_rows(flags, session.rank(), session.size());
  Band band = make_band(flags, first, rows, session);
  HaloStep step(session, band);
  if (session.is_lead()) {
    std::printf("halo_exchange: ranks=%d device=%s backend=%s plate=%lldx%lld steps=%lld\n", session.size(),
                session.device().str().c_str(), ddp::backend_name(session.backend()).c_str(), flags.rows + 2,
                flags.cols + 2, flags.steps);
  }
  const auto start = std::chrono::steady_clock::now();
  for (long long s = 1; s <= flags.steps; ++s) {
    step();
    if (s % flags.log_every != 0 && s != flags.steps) continue;
    const double heat = total_heat(band, session);  // reads the band back: waits for the step
    if (session.is_lead()) std::printf("step %lld total_heat %.6f\n", s, heat);
  }
  session.stream().synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (session.is_lead()) std::printf("seconds_per_step=%.6f\n", flags.steps > 0 ? seconds / flags.steps : 0.0);
  if (!flags.check) return 0;
  const double diff = difference_from_one_rank(flags, band, session);
  if (session.is_lead()) std::printf("max_abs_diff=%g (against the one-rank result)\n", diff);
  return diff == 0.0 ? 0 : 1;
}

}  // namespace halo

int main(int argc, char** argv) {
  return ddp::run_main([&] { return halo::run(argc, argv); });
}
