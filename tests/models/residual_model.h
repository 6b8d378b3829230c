// The residual LayerNorm GELU model the layer tests share (the CPU tests, the PyTorch comparison and the GPU
// suite): Linear(8, 32), two ResidualBlock(Sequential(LayerNorm(32), Linear(32, 32), GELU)), Linear(32, 3), with
// the state_dict keys of the same torch.nn.Sequential ("1.body.0.weight", ...).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/models/layers.h"

namespace ddp::test {

inline std::shared_ptr<Sequential> residual_layer_norm_gelu_model(std::uint64_t seed, const Device& device,
                                                                  const Stream& stream, std::int64_t in = 8,
                                                                  std::int64_t width = 32, std::int64_t out = 3) {
  auto model = std::make_shared<Sequential>();
  std::uint64_t offset = 0;
  auto linear = [&](std::int64_t i, std::int64_t o) {
    auto layer = std::make_shared<Linear>(i, o, true, seed, offset, device, stream);
    offset += layer->init_counters();
    return layer;
  };
  model->add(linear(in, width));
  for (int block = 0; block < 2; ++block) {
    auto body = std::make_shared<Sequential>();
    body->add(std::make_shared<LayerNorm>(width, 1e-5, device, stream));
    body->add(linear(width, width));
    body->add(std::make_shared<ActivationLayer>(Activation::kGelu));
    model->add(std::make_shared<ResidualBlock>(body));
  }
  model->add(linear(width, out));
  return model;
}

}  // namespace ddp::test
