// Built by CMake against an installed runtime (find_package(ddp), target ddp::ddp): an MLP learns to tell two
// Gaussian clusters apart, each rank on samples of its own, under DistributedDataParallel. Rank 0 prints the
// accuracy over all ranks' samples; the exit status says whether it passed 0.95.
#include <cstdio>
#include <vector>

#include <ddp.h>

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::Session session(&argc, &argv);
    const ddp::Stream& stream = session.stream();
    // 256 points per rank: class 1 around (+1, +1), class 0 around (-1, -1).
    constexpr std::int64_t kPoints = 256;
    ddp::Tensor x = ddp::Tensor::normal({kPoints, 2}, 0.0f, 0.6f, /*seed=*/5, 2 * kPoints * session.rank(),
                                        session.device(), stream);
    std::vector<float> centres(2 * kPoints);
    std::vector<std::int32_t> labels(kPoints);
    for (std::int64_t i = 0; i < kPoints; ++i) {
      labels[i] = static_cast<std::int32_t>(i % 2);
      centres[2 * i] = centres[2 * i + 1] = labels[i] == 1 ? 1.0f : -1.0f;
    }
    x = ddp::ops::add(x, ddp::Tensor::from_vector(centres, {kPoints, 2}, session.device(), stream), stream);
    const ddp::Tensor y = ddp::Tensor::from_int32(labels, {kPoints}, session.device(), stream);

    ddp::MLP model({2, 16, 2}, ddp::Activation::kGelu, /*seed=*/1, session.device(), stream);
    ddp::AdamW optimizer(model, {.lr = 1e-2}, stream);
    ddp::DistributedDataParallel ddp_model(model, session);
    for (int step = 0; step < 100; ++step) {
      model.zero_grad(stream);
      ddp_model.backward(ddp::ops::cross_entropy(model.forward(x, stream), y, stream));
      optimizer.step(stream);
    }
    ddp::autograd::NoGradGuard no_grad;
    const double correct = ddp::ops::count_correct(model.forward(x, stream), y, stream).item(stream);
    const double accuracy = session.sum(correct) / (kPoints * session.size());
    const bool ok = accuracy > 0.95;
    if (session.is_lead()) {
      std::printf("two_clusters: ranks=%d device=%s accuracy %.4f %s\n", session.size(),
                  session.device().str().c_str(), accuracy, ok ? "OK" : "too low");
    }
    return ok ? 0 : 1;
  });
}
