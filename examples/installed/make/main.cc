// Built by a Makefile through pkg-config against an installed runtime: each rank passes a tensor around the ring
// of ranks with the process group's point-to-point send_recv and adds what it receives, so that after one lap
// every rank holds the sum over all ranks, which it checks against the host collective session.sum.
#include <cstdio>
#include <vector>

#include <ddp.h>

int main(int argc, char** argv) {
  return ddp::run_main([&] {
    ddp::Session session(&argc, &argv);
    const ddp::Stream& stream = session.stream();
    const int next = (session.rank() + 1) % session.size();
    const int previous = (session.rank() + session.size() - 1) % session.size();
    const double mine = 1.0 + session.rank();
    ddp::Tensor total = ddp::Tensor::full({1000}, mine, ddp::DType::kFloat32, session.device(), stream);
    ddp::Tensor passing = total.clone(stream);
    ddp::Tensor arriving = ddp::Tensor::zeros({1000}, ddp::DType::kFloat32, session.device(), stream);
    for (int hop = 1; hop < session.size(); ++hop) {
      session.group()
          .send_recv({{ddp::CommBuffer::of(passing), next}}, {{ddp::CommBuffer::of(arriving), previous}}, stream)
          ->wait(stream);
      total = ddp::ops::add(total, arriving, stream);
      passing.copy_from(arriving, stream);
    }
    const double expected = session.sum(mine);
    bool right = true;
    for (float v : total.to_vector<float>(stream)) right = right && v == expected;
    const bool ok = !session.any(!right);
    if (session.is_lead()) {
      std::printf("ring: ranks=%d device=%s sum %.1f %s\n", session.size(), session.device().str().c_str(), expected,
                  ok ? "OK" : "wrong");
    }
    return ok ? 0 : 1;
  });
}
