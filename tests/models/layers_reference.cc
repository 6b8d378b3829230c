// What the runtime computes for the MLP family's ops and modules on the CPU, written for PyTorch to check
// (tests/models/layers_torch_test.py): each op's inputs, output and gradients of an MSE loss in DIR/ops.safetensors,
// and a trained residual LayerNorm GELU model's training checkpoint with its outputs and gradients on a batch.
//
//   layers_reference DIR
#include <cstdint>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/io/safetensors.h"
#include "runtime/models/layers.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"
#include "runtime/training/training_checkpoint.h"
#include "tests/models/residual_model.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

// Named host copies of tensors, kept alive until the file is written.
class Dump {
 public:
  void add(const std::string& name, const Tensor& t) {
    const Tensor host = t.copy_to(Device::cpu(), S());
    auto& bytes = storage_.emplace_back(host.nbytes());
    std::copy_n(static_cast<const std::uint8_t*>(host.data_ptr()), host.nbytes(), bytes.data());
    sources_.push_back({name, t.dtype(), t.shape(), bytes.data(), bytes.size(), nullptr});
  }
  void save(const std::string& path) const { io::save_safetensors(path, sources_, {}); }

 private:
  std::deque<std::vector<std::uint8_t>> storage_;
  std::vector<io::TensorSource> sources_;
};

Tensor leaf(const Shape& shape, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::uniform(shape, lo, hi, seed, 0, Device::cpu(), S());
  t.set_requires_grad(true);
  return t;
}

// y = f(), backward of mse_loss(y, target); records "<op>.y", "<op>.target" and the inputs and their gradients.
void record(Dump& dump, const std::string& op, const std::vector<std::pair<std::string, Tensor>>& inputs,
            const std::function<Tensor()>& f) {
  for (const auto& [name, t] : inputs) {
    if (t.requires_grad()) autograd::zero_grad({t});
  }
  const Tensor y = f();
  const Tensor target = Tensor::uniform(y.shape(), -1.0f, 1.0f, 4242, 0, Device::cpu(), S());
  autograd::backward(ops::mse_loss(y, target, S()), S());
  dump.add(op + ".y", y);
  dump.add(op + ".target", target);
  for (const auto& [name, t] : inputs) {
    dump.add(op + "." + name, t);
    if (t.requires_grad()) dump.add(op + ".grad." + name, t.grad());
  }
}

void ops_reference(const std::string& dir) {
  Dump dump;
  Tensor x = leaf({4, 7}, 1, -4.0f, 4.0f);
  record(dump, "silu", {{"x", x}}, [&] { return ops::silu(x, S()); });

  Tensor xn = leaf({5, 12}, 2, -2.0f, 3.0f), w = leaf({12}, 3), b = leaf({12}, 4);
  record(dump, "layer_norm", {{"x", xn}, {"weight", w}, {"bias", b}},
         [&] { return ops::layer_norm(xn, w, b, 1e-5, S()); });

  Tensor xf = leaf({4, 3}, 5);
  record(dump, "frequency_encoding", {{"x", xf}}, [&] { return ops::frequency_encoding(xf, 5, true, S()); });
  record(dump, "frequency_encoding_no_input", {{"x", xf}}, [&] { return ops::frequency_encoding(xf, 3, false, S()); });

  Tensor xd = leaf({6, 10}, 6, 0.5f, 1.5f);  // never 0, so the kept elements are where y != 0
  Tensor draw = Tensor::full({1}, 3.0, DType::kInt64, Device::cpu(), S());
  record(dump, "dropout", {{"x", xd}}, [&] { return ops::dropout(xd, 0.3, 5, draw, S()); });

  Tensor table = leaf({7, 4}, 7);
  const Tensor ids = Tensor::from_int32({3, 0, 3, 6, 1, 3, 6, 0, 2}, {9}, Device::cpu(), S());
  record(dump, "embedding", {{"weight", table}, {"indices", ids}}, [&] { return ops::embedding(table, ids, S()); });

  CategoricalFeatures features({4, 3}, 3, 8);
  const Tensor xc = Tensor::from_vector({3, 2, 0.5f, -1.0f, 2.0f, 0, 0, 1.0f, 0.25f, -0.5f, 1, 2, -1.0f, 0.0f, 1.5f,
                                         2, 1, 0.0f, 3.0f, -2.0f, 3, 0, 0.75f, 0.5f, 0.25f},
                                        {5, 5}, Device::cpu(), S());
  std::vector<std::pair<std::string, Tensor>> named{{"x", xc}};
  for (const auto& [name, t] : features.state_dict()) named.emplace_back(name, t);
  record(dump, "categorical", named, [&] { return features.forward(xc, S()); });
  dump.save(dir + "/ops.safetensors");
}

// Trained for two SGD steps so the checkpoint holds weights no initialisation gives; then the outputs and
// gradients on a fresh batch.
void model_reference(const std::string& dir) {
  auto model = test::residual_layer_norm_gelu_model(11, Device::cpu(), S());
  Sgd optimizer(*model, SgdOptions{0.05, 0.9}, S());
  const Tensor x = Tensor::uniform({16, 8}, -2.0f, 2.0f, 12, 0, Device::cpu(), S());
  const Tensor t = Tensor::uniform({16, 3}, -1.0f, 1.0f, 13, 0, Device::cpu(), S());
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(S());
    autograd::backward(ops::mse_loss(model->forward(x, S()), t, S()), S());
    optimizer.step(S());
  }
  io::CheckpointMetadata where;
  where.step = 2;
  const std::string path = training::save_training_checkpoint(dir + "/checkpoints", *model, optimizer, where, S());
  Dump dump;
  const Tensor batch = Tensor::uniform({16, 8}, -2.0f, 2.0f, 14, 0, Device::cpu(), S());
  model->zero_grad(S());
  const Tensor y = model->forward(batch, S());
  autograd::backward(ops::mse_loss(y, t, S()), S());
  dump.add("x", batch);
  dump.add("target", t);
  dump.add("y", y);
  for (const auto& [name, p] : model->state_dict()) dump.add("grad." + name, p.grad());
  dump.save(dir + "/model_io.safetensors");
  std::cout << "checkpoint=" << path << "\n";
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: layers_reference DIR\n";
    return 2;
  }
  ddp::ops_reference(argv[1]);
  ddp::model_reference(argv[1]);
  return 0;
}
