// A program in another Bazel workspace: it includes the runtime's one public header and links @ddp//:ddp, to
// show (and test, via tools/test_external_workspace.sh) that the runtime builds and runs as an external
// repository. It fits y = 2x - 1 with one Linear under DDP and prints the loss before and after.
#include <cstdio>
#include <vector>

#include "ddp.h"

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::Session session(&argc, &argv);
    const ddp::Stream& stream = session.stream();
    ddp::Linear model(1, 1, /*bias=*/true, /*seed=*/7, /*offset=*/0, session.device(), stream);
    ddp::DistributedDataParallel ddp(model, session);
    ddp::Sgd optimizer(model, {.lr = 0.1}, stream);

    // Every rank holds its own points of the line; DDP averages their gradients.
    std::vector<float> xs, ys;
    for (int i = 0; i < 16; ++i) {
      const float x = -1.0f + 0.125f * static_cast<float>(i) + 0.01f * static_cast<float>(session.rank());
      xs.push_back(x);
      ys.push_back(2.0f * x - 1.0f);
    }
    const ddp::Tensor x = ddp::Tensor::from_vector(xs, {16, 1}, session.device(), stream);
    const ddp::Tensor y = ddp::Tensor::from_vector(ys, {16, 1}, session.device(), stream);

    double first = 0, last = 0;
    for (int step = 0; step < 200; ++step) {
      model.zero_grad(stream);
      ddp::Tensor loss = ddp::ops::mse_loss(model.forward(x, stream), y, stream);
      if (step == 0) first = loss.item(stream);
      ddp.backward(loss);
      optimizer.step(stream);
      last = loss.item(stream);
    }
    const bool ok = last < 0.01 * first;
    if (session.is_lead()) {
      std::printf("consumer: ranks=%d device=%s loss %.6f -> %.6f %s\n", session.size(), session.device().str().c_str(),
                  first, last, ok ? "OK" : "did not converge");
    }
    return ok ? 0 : 1;
  });
}
