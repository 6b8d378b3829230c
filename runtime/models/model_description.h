// Models from a description: a JSON document lists the layers, and build_model makes the Sequential they describe.
// It exists so that a program that cannot write C++ (the C API, the Fortran module) can still build any model of
// the runtime's layers, and so that a model trained elsewhere (PyTorch) can be rebuilt here with the state_dict
// names its weights carry.
//
//   {"inputs": 5, "layers": [{"type": "linear", "out": 64}, {"type": "tanh"},
//                            {"type": "residual", "body": [{"type": "layer_norm"}, {"type": "linear", "out": 64},
//                                                          {"type": "gelu"}]},
//                            {"type": "linear", "out": 1}]}
//
// Layers ("type", then its keys; widths are tracked from "inputs" through the layers):
//   linear              "out" (required), "in" (optional, must equal the width so far), "bias" (default true)
//   relu, gelu, tanh, sigmoid, silu                       no keys
//   layer_norm          "eps" (default 1e-5); over the width so far
//   residual            "body" (a non-empty list of layers), "projection" (optional list of layers): body(x) +
//                       projection(x), or body(x) + x when there is none (the body must then keep the width)
//   frequency_encoding  "frequencies" (required, 0 to 64), "include_input" (default true)
//   dropout             "p" (default 0.5, in [0, 1))
//
// The state_dict names are those of the same torch.nn.Sequential: each layer at its index, a residual's lists
// as nn.Sequential attributes "body" and "projection" ("1.body.0.weight", "1.projection.0.bias"); activations,
// encodings and dropouts take an index and hold nothing. Every Linear, in depth-first order, draws its weights
// from its own counter range of `seed` (as MLP's layers do), so the same seed gives the same model on every
// rank and device; Dropout k draws its masks from a seed of its own derived from `seed`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/core/stream.h"
#include "runtime/models/layers.h"

namespace ddp {

struct DescribedModel {
  std::shared_ptr<Sequential> model;
  std::int64_t inputs = 0;
  std::int64_t outputs = 0;
  // The description with every default written out, as compact JSON: equal for two descriptions of the same
  // model however they were spelled, different for any two models that differ (a checkpoint records it).
  std::string architecture;
};

// Builds the model `json` describes. Anything wrong in it (malformed JSON, an unknown type or key, a missing or
// bad value, a width that does not fit) is an InvalidArgument naming the layer's path and the key, e.g.
// `model description: layers[1].body[0] (linear): key "out" must be a positive integer, got -3`.
DescribedModel build_model(const std::string& json, std::uint64_t seed, const Device& device = Device::cpu(),
                           const Stream& stream = current_stream());

}  // namespace ddp
