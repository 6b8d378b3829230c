// A job in which the last rank never joins the first gradient all-reduce (it sleeps, as a hung or dead peer
// would): the watchdog of the waiting ranks must end the whole job, naming the rank, the collective, the
// bucket and the step. Run by stalled_collective_test.sh with a short DDP_COLLECTIVE_TIMEOUT_S.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "runtime/distributed/reducer.h"
#include "runtime/distributed/world.h"

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::World world(&argc, &argv);
    auto group = ddp::make_process_group(world, world.device(), ddp::Backend::kMpi);
    std::vector<ddp::ParameterSpec> specs = {{"0.weight", {64, 64}}, {"0.bias", {64}}};
    ddp::BucketPlan plan = ddp::plan_buckets(specs);
    std::vector<float> grads(plan.total, 1.0f);
    ddp::Stream cpu;
    ddp::Reducer reducer(*group, plan, ddp::CommBuffer{grads.data(), plan.total, ddp::DType::kFloat32,
                                                       ddp::Device::cpu()},
                         cpu);
    if (world.rank() == world.size() - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
    reducer.prepare_for_backward();
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finalize();
    std::printf("rank %d: the all-reduce completed although a rank never joined it\n", world.rank());
    return 0;
  });
}
