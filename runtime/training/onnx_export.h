// ONNX export of a trained MLP: the model leaves the runtime in a format deployment runtimes load (ONNX Runtime,
// TensorRT, OpenVINO), not only as safetensors for PyTorch.
//
// The graph is built with Debian's ONNX library (libonnx-dev 1.12: onnx::ModelProto over protobuf) and checked
// with onnx::checker::check_model before it is written. Layers map one to one:
//   Linear          -> Gemm(input, weight [out, in], bias [out], transB = 1)   (initialisers "0.weight", "0.bias")
//   ReLU/Tanh/Sigmoid -> Relu/Tanh/Sigmoid
//   GELU            -> 0.5·x·(1 + Erf(x/√2)): the exact form the runtime computes; ONNX's Gelu operator needs
//                      opset 20, which ONNX 1.12 (its checker) does not know.
// Input "input" [N, in_features] float, output "output" [N, out_features] float, N dynamic. Opset 17.
// Parameters in bfloat16 are widened to float32 (exactly), so a model trained in either precision exports.
//
//   ddp::export_onnx(model, "run/model.onnx", stream);
#pragma once

#include <string>

#include "runtime/core/stream.h"
#include "runtime/models/layers.h"

namespace ddp {

struct OnnxExportOptions {
  std::string graph_name = "mlp";
  std::string producer_name = "ddp";
  std::string doc_string;  // free text kept in the model (a run's description)
};

// The serialised, checked ONNX ModelProto of `model`: a Sequential (an MLP, or nested Sequentials) of Linear
// and activation layers. Reads the parameters to the host on `stream` (synchronises it). Throws
// InvalidArgument naming the layer for any other module, InternalError if ONNX's checker rejects the graph.
std::string onnx_model_bytes(const Sequential& model, const Stream& stream, const OnnxExportOptions& options = {});

// onnx_model_bytes written to `path` atomically (the old file stays whole if writing fails). Throws
// InvalidArgument naming the path when its directory is missing or not writable.
void export_onnx(const Sequential& model, const std::string& path, const Stream& stream,
                 const OnnxExportOptions& options = {});

}  // namespace ddp
