// Module: the unit a model is built from — named parameters in registration order, children, train/eval,
// moving to a device, a state dict with PyTorch's names, and the flat parameter/gradient buffers.
//
// Why names matter: checkpoints and DDP's cross-rank check identify parameters by name, and the names equal
// PyTorch's for the same nn.Sequential ("0.weight", "0.bias", "2.weight", ...), so a checkpoint loads there.
//
// Flat buffers: flatten_parameters() moves every parameter into one ParameterStore (runtime/autograd/
// parameter_store.h) on the module's device; parameter tensors (every handle, including the ones inside the
// layers) become views into it, so forward/backward need no change. DistributedDataParallel and the optimizers
// built from a module flatten it themselves when nobody has yet, and work on the store. The store, once made,
// stays the same object for the module's life: flattening again or moving the module re-lays it in place, and
// whoever holds it (an optimizer, DDP) sees the new layout_version() and follows it or refuses, saying why.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/parameter_store.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/tensor.h"

namespace ddp {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The module applied to `x`, enqueued on `stream` (a stream of the module's device; on the CPU the work is
  // done on return), recorded for backward when grad mode is on. Shape or type errors are InvalidArgument naming
  // the op and the tensors.
  virtual Tensor forward(const Tensor& x, const Stream& stream = current_stream()) = 0;
  virtual std::string type_name() const = 0;

  // This module's and its children's parameters, depth first in registration order, with dotted names.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::int64_t num_parameters() const;  // elements
  // The parameters by name (the tensors themselves, not copies): PyTorch's state_dict keys.
  NamedTensors state_dict() const { return named_parameters(); }
  // Copies values in by name on `stream`; every key must exist with the same shape, and none may be missing or
  // extra (InvalidArgument naming the key otherwise).
  void load_state_dict(const NamedTensors& state, const Stream& stream = current_stream());

  void train(bool training = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter and buffer to `device` (values copied on `stream`). If the parameters are flattened, the
  // store moves there in place with the same layout; gradients are reset. Nothing happens on the device they are on.
  void to(const Device& device, const Stream& stream = current_stream());
  const Device& device() const { return device_; }

  // Puts all parameters into one flat buffer (and their gradients into another) on the device that holds them
  // (they must all be on one; InvalidArgument otherwise), in `layout` order (registration indices; empty:
  // registration order). A module already flattened is re-laid out in place (values and gradients kept).
  ParameterStore& flatten_parameters(const Stream& stream, std::vector<std::size_t> layout = {});
  // The store, made now in registration order if the module is not flattened yet.
  ParameterStore& flat_parameters(const Stream& stream = current_stream());
  ParameterStore* parameter_store() const { return store_.get(); }
  // Zeroes every parameter gradient before a backward: one fill of the flat buffer on `stream` when flattened.
  void zero_grad(const Stream& stream = current_stream());

  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // State that is not a parameter (no gradient, no optimizer, not in state_dict(), as torch's Dropout has none
  // there) but that a resumed run needs: Dropout's draw counter. Dotted names as named_parameters(); the tensors
  // themselves, which to() moves with the parameters. Training checkpoints save and restore them.
  NamedTensors named_buffers() const;

 protected:
  // Registers a parameter (requires_grad is set) and returns the tensor handle the layer keeps.
  Tensor register_parameter(std::string name, Tensor tensor);
  // Registers a buffer (see named_buffers) and returns the tensor handle the layer keeps.
  Tensor register_buffer(std::string name, Tensor tensor);
  void register_module(std::string name, std::shared_ptr<Module> module);
  void set_device(const Device& device);

 private:
  void collect(const std::string& prefix, NamedTensors& out) const;
  void collect_buffers(const std::string& prefix, NamedTensors& out) const;
  Device parameters_device() const;
  ParameterStore& flatten_onto(const Device& device, const Stream& stream, std::vector<std::size_t> layout);

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<ParameterStore> store_;
  Device device_ = Device::cpu();
  bool training_ = true;
};

}  // namespace ddp
