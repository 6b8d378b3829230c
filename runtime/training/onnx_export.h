// ONNX export of a trained model: the model leaves the runtime in a format deployment runtimes load (ONNX Runtime,
// TensorRT, OpenVINO), not only as safetensors for PyTorch.
//
// The graph is built with Debian's ONNX library (libonnx-dev 1.12: onnx::ModelProto over protobuf) and checked
// with onnx::checker::check_model before it is written. Layers map one to one:
//   Linear          -> Gemm(input, weight [out, in], bias [out], transB = 1)   (initialisers "0.weight", "0.bias")
//   ReLU/Tanh/Sigmoid -> Relu/Tanh/Sigmoid
//   GELU            -> 0.5·x·(1 + Erf(x/√2)): the exact form the runtime computes; ONNX's Gelu operator needs
//                      opset 20, which ONNX 1.12 (its checker) does not know.
//   SiLU            -> x·Sigmoid(x)
//   LayerNorm       -> LayerNormalization(axis = -1, epsilon)   (initialisers "<name>.weight", "<name>.bias")
//   ResidualBlock   -> Add(body(x), projection(x) or x)
//   FrequencyEncoding -> Concat(x, Sin(a_0·x), Cos(a_0·x), ...) with Mul by the kernels' float a_k = 2^k·π
//   CategoricalFeatures -> per id column Gather(x, j, axis 1), Cast to int64, Gather(embeddings.j.weight), then
//                      Slice(x, k:) and Concat; ids must be in range there (ONNX's Gather has no zero row)
//   Dropout         -> nothing (the identity at inference)
// Sequentials nest to any depth; any other module is refused by name.
// Input "input" [N, in_features] float, output "output" [N, out_features] float, N dynamic. Opset 17.
// Parameters in bfloat16 are widened to float32 (exactly), so a model trained in either precision exports.
//
//   ddp::export_onnx(model, "run/model.onnx", stream);
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/stream.h"
#include "runtime/models/layers.h"

namespace ddp {

struct OnnxExportOptions {
  std::string graph_name = "mlp";
  std::string producer_name = "ddp";
  std::string doc_string;  // free text kept in the model (a run's description)
  // The input's number of features, for a model none of whose layers says it (one starting with
  // CategoricalFeatures followed by no Linear); -1: taken from the layers.
  std::int64_t input_features = -1;
};

// The serialised, checked ONNX ModelProto of `model`: a tree of the layers above (an MLP, a residual LayerNorm
// model, ...). Reads the parameters to the host on `stream` (synchronises it). Throws InvalidArgument naming the
// layer for any other module or widths that do not chain, InternalError if ONNX's checker rejects the graph.
std::string onnx_model_bytes(const Module& model, const Stream& stream, const OnnxExportOptions& options = {});

// onnx_model_bytes written to `path` atomically (the old file stays whole if writing fails). Throws
// InvalidArgument naming the path when its directory is missing or not writable.
void export_onnx(const Module& model, const std::string& path, const Stream& stream,
                 const OnnxExportOptions& options = {});

}  // namespace ddp
