// All-reduce bandwidth of our NCCL process group against NCCL's own ncclAllReduce loop, in the same process, on
// the same communicator and buffers: what the ProcessGroup layer (events ordering the communication stream after
// the caller's, the watchdog, the Work objects) costs on top of NCCL itself. One rank per GPU.
//
//   mpirun -np 8 bench/allreduce_bench [--min-mib 1] [--max-mib 256] [--iters 20]
//
// Per size, rank 0 prints a JSON line with the algorithm bandwidth (bytes / time) and the bus bandwidth
// (algbw x 2(n-1)/n, NCCL's tests' convention: what each link carries) of both, and their ratio. Times are CUDA
// events around `iters` back-to-back all-reduces after warm-up, the median of 5 repeats.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/core/check.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/mpi_nccl_errors.h"
#include "runtime/distributed/nccl_communicator.h"
#include "runtime/distributed/process_group_nccl.h"
#include "runtime/distributed/world.h"

namespace {

struct Flags {
  double min_mib = 1;
  double max_mib = 256;
  int iters = 20;
  int repeats = 5;
};

// Milliseconds per call of `enqueue` on `stream`: the median over repeats of `iters` back-to-back calls. Every
// repeat starts with the ranks lined up (the stream drained, then a host barrier): otherwise the first
// all-reduce of a repeat waits for the slowest rank's host, and that skew, divided over the repeat, reads as a
// fixed latency of every call.
template <typename Enqueue>
double ms_per_call(const ddp::World& world, const ddp::Stream& stream, const Flags& f, Enqueue&& enqueue) {
  for (int i = 0; i < 3; ++i) enqueue();
  std::vector<double> ms;
  for (int r = 0; r < f.repeats; ++r) {
    stream.synchronize();
    world.max(0.0);
    ddp::Event start = ddp::Event::create(stream.device(), true), stop = ddp::Event::create(stream.device(), true);
    start.record(stream);
    for (int i = 0; i < f.iters; ++i) enqueue();
    stop.record(stream);
    stop.synchronize();
    ms.push_back(stop.elapsed_ms_since(start) / f.iters);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(int argc, char** argv) {
  Flags f;
  CLI::App app{"All-reduce bandwidth: our NCCL process group against NCCL's own loop"};
  app.add_option("--min-mib", f.min_mib, "smallest buffer (MiB)");
  app.add_option("--max-mib", f.max_mib, "largest buffer (MiB), doubling from the smallest");
  app.add_option("--iters", f.iters, "all-reduces per timed repeat");
  app.add_option("--repeats", f.repeats, "timed repeats (the median is reported)");
  CLI11_PARSE(app, argc, argv);

  ddp::WorldOptions options;
  options.device = ddp::DeviceRequest::kCuda;
  ddp::World world(&argc, &argv, options);
  ddp::ProcessGroupNccl group(world);
  ddp::NcclCommunicator& nccl = *world.nccl();
  ddp::Stream stream = ddp::Stream::create(world.device());
  const int n = world.size();
  for (double mib = f.min_mib; mib <= f.max_mib; mib *= 2) {
    const auto count = static_cast<std::int64_t>(mib * (1 << 20) / sizeof(float));
    float* data = nullptr;
    DDP_CUDA_CHECK(cudaMalloc(&data, count * sizeof(float)));
    DDP_CUDA_CHECK(cudaMemsetAsync(data, 0, count * sizeof(float), stream.handle()));
    const ddp::CommBuffer buffer{data, count, ddp::DType::kFloat32, world.device()};
    // Ours: the caller's stream waits for each collective, as DDP's optimizer does, so the timing covers the
    // whole round trip of the process group's ordering.
    const double ours_ms = ms_per_call(world, stream, f, [&] {
      group.all_reduce(buffer, ddp::ReduceOp::kSum, stream)->wait(stream);
    });
    const double nccl_ms = ms_per_call(world, stream, f, [&] {
      DDP_NCCL_CALL(&nccl, ncclAllReduce(data, data, count, ncclFloat32, ncclSum, nccl.handle(), stream.handle()));
    });
    DDP_CUDA_CHECK(cudaFree(data));
    if (world.rank() == 0) {
      const double bytes = static_cast<double>(count) * sizeof(float);
      const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      auto gbps = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
      std::printf(
          "{\"bench\": \"allreduce\", \"ranks\": %d, \"mib\": %g, \"ours_ms\": %.4f, \"nccl_ms\": %.4f, "
          "\"ours_busbw_gbps\": %.1f, \"nccl_busbw_gbps\": %.1f, \"ours_over_nccl\": %.3f}\n",
          n, mib, ours_ms, nccl_ms, gbps(ours_ms) * bus, gbps(nccl_ms) * bus, nccl_ms / ours_ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::run_main([&] { return run(argc, argv); });
}
