// The seed program done right: every rank fills its slice of 0..N-1, doubles it on its device, sums it in
// double precision, and the ranks all-reduce their sums (NCCL on GPUs, MPI on CPUs). Rank 0 prints the
// global sum and checks it against the closed form N(N-1), exiting non-zero on a mismatch.
//
//   mpirun -np 4 bazel-bin/examples/allreduce_sum [--device auto|cpu|cuda] [--n-local N]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/allreduce_sum_kernels.h"
#include "examples/cli_checks.h"
#include "runtime/core/check.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/world.h"

namespace {

struct Flags {
  ddp::DeviceRequest device = ddp::DeviceRequest::kAuto;
  long long n_local = 1 << 20;
};

// Parses and validates; throws InvalidArgument with what was wrong. --help prints and exits 0.
Flags parse_flags(int argc, char** argv) {
  Flags flags;
  std::string device = "auto";
  CLI::App app{"allreduce_sum: every rank doubles its slice of 0..N-1 and the ranks sum it (under mpirun)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", device, "where each rank runs (auto: a GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--n-local", flags.n_local, "elements per rank (at most 2^24: the floats stay exact)")
      ->check(CLI::Range(1LL, 1LL << 24));
  examples::parse_or_throw(app, argc, argv);
  flags.device = ddp::parse_device_request(device);
  return flags;
}

// Sum of this rank's doubled slice, computed on the world's device.
double local_doubled_sum(const ddp::World& world, std::vector<float>& values) {
  const std::size_t n = values.size();
  if (world.device().is_cpu()) {
    double sum = 0.0;
    for (float& v : values) {
      v *= 2.0f;
      sum += static_cast<double>(v);
    }
    return sum;
  }
  ddp::Stream stream = ddp::Stream::create(world.device());
  float* data = nullptr;
  double* scratch = nullptr;
  const std::size_t scratch_len = ddp::examples::double_and_sum_scratch(n) + 1;
  DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data), n * sizeof(float), stream.handle()));
  DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), scratch_len * sizeof(double),
                                 stream.handle()));
  DDP_CUDA_CHECK(cudaMemcpyAsync(data, values.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream.handle()));
  double* sum = scratch + scratch_len - 1;
  ddp::examples::double_and_sum_cuda(data, n, sum, scratch, scratch_len - 1, stream.handle());

  // The cross-rank reduction of the per-rank sums runs through NCCL, on the same stream.
  ddp::NcclCommunicator* nccl = world.nccl();
  DDP_NCCL_CALL(nccl, ncclAllReduce(sum, sum, 1, ncclDouble, ncclSum, nccl->handle(), stream.handle()));
  double result = 0.0;
  DDP_CUDA_CHECK(cudaMemcpyAsync(&result, sum, sizeof(double), cudaMemcpyDeviceToHost, stream.handle()));
  DDP_CUDA_CHECK(cudaFreeAsync(data, stream.handle()));
  DDP_CUDA_CHECK(cudaFreeAsync(scratch, stream.handle()));
  stream.synchronize();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    const auto [flags, flag_error] =
        examples::parse_now_report_later<Flags>([&] { return parse_flags(argc, argv); });
    ddp::WorldOptions options;
    options.device = flags.device;
    ddp::World world(&argc, &argv, options);
    world.agree(flag_error, "bad command line");
    const std::size_t n_local = static_cast<std::size_t>(flags.n_local);
    std::vector<float> values(n_local);
    const double offset = static_cast<double>(world.rank()) * static_cast<double>(n_local);
    for (std::size_t i = 0; i < n_local; ++i) values[i] = static_cast<float>(static_cast<double>(i) + offset);

    // On the GPU the sum over ranks ran through NCCL already; on the CPU it is the world's host collective.
    const double local = local_doubled_sum(world, values);
    const double global = world.device().is_cuda() ? local : world.sum(local);

    // sum_{i<N} 2i = N(N-1), exact in double for N < 2^26.
    const double total = static_cast<double>(n_local) * world.size();
    const double expected = total * (total - 1.0);
    if (world.rank() == 0) {
      std::printf("Global sum = %.2f\n", global);
      std::printf("ranks=%d device=%s reduction=%s\n", world.size(), world.device().str().c_str(),
                  world.device().is_cuda() ? "nccl" : "mpi");
      if (global != expected) {
        std::fprintf(stderr, "error: expected %.2f, the global sum differs by %.2f\n", expected, global - expected);
      }
    }
    return global == expected ? 0 : 1;
  });
}
