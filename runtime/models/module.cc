// Module: parameter registry, state dict, device moves and flattening.
#include "runtime/models/module.h"

#include <unordered_map>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"

namespace ddp {

Tensor Module::register_parameter(std::string name, Tensor tensor) {
  DDP_CHECK(tensor.defined(), type_name() + ": parameter " + name + " is undefined");
  for (const auto& [n, t] : params_) DDP_CHECK(n != name, type_name() + ": parameter " + name + " registered twice");
  tensor.set_requires_grad(true);
  params_.emplace_back(std::move(name), tensor);
  return tensor;
}

Tensor Module::register_buffer(std::string name, Tensor tensor) {
  DDP_CHECK(tensor.defined(), type_name() + ": buffer " + name + " is undefined");
  for (const auto& [n, t] : buffers_) DDP_CHECK(n != name, type_name() + ": buffer " + name + " registered twice");
  buffers_.emplace_back(std::move(name), tensor);
  return tensor;
}

void Module::register_module(std::string name, std::shared_ptr<Module> module) {
  DDP_CHECK(module != nullptr, type_name() + ": child " + name + " is null");
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::set_device(const Device& device) {
  device_ = device;
  for (auto& [name, child] : children_) child->set_device(device);
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

void Module::collect_buffers(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect_buffers(prefix + name + ".", out);
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect_buffers("", out);
  return out;
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::load_state_dict(const NamedTensors& state, const Stream& stream) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name[name] = &t;
  NamedTensors mine = named_parameters();
  for (const auto& [name, t] : mine) {
    auto it = by_name.find(name);
    DDP_CHECK(it != by_name.end(), "load_state_dict: " + type_name() + " expects " + name + " (" + t.describe() +
                                       "), missing from the state dict");
    DDP_CHECK(it->second->shape() == t.shape(), "load_state_dict: " + name + " is " +
                                                    shape_str(it->second->shape()) + " in the state dict, " +
                                                    shape_str(t.shape()) + " in the model");
    Tensor dst = t;
    if (it->second->dtype() == t.dtype()) {
      dst.copy_from(*it->second, stream);
    } else {
      dst.copy_from(it->second->copy_to(t.device(), stream).to_dtype(t.dtype(), stream), stream);
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    throw InvalidArgument("load_state_dict: unexpected key " + by_name.begin()->first + " for " + type_name());
  }
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::to(const Device& device, const Stream& stream) {
  for (auto& [name, t] : named_buffers()) {
    if (t.device() == device) continue;
    Tensor handle = t;
    handle.set_data(t.copy_to(device, stream));
  }
  if (store_ != nullptr) {
    if (device != store_->device()) flatten_onto(device, stream, store_->layout());
    return;
  }
  for (auto& [name, t] : named_parameters()) {
    if (t.device() == device) continue;
    Tensor moved = t.copy_to(device, stream);
    Tensor handle = t;
    handle.set_data(moved);
    handle.set_grad(Tensor());
  }
  set_device(device);
}

Device Module::parameters_device() const {
  const NamedTensors params = named_parameters();
  if (params.empty()) return device_;
  const auto& [first_name, first] = params.front();
  for (const auto& [name, t] : params) {
    if (t.device() != first.device()) {
      throw InvalidArgument(type_name() + ": parameter " + first_name + " is on " + first.device().str() + " but " +
                            name + " is on " + t.device().str() +
                            "; move the whole module with to(device) before flatten_parameters");
    }
  }
  return first.device();
}

ParameterStore& Module::flatten_parameters(const Stream& stream, std::vector<std::size_t> layout) {
  // The store goes where the parameters are, whether or not a user-written module declared its device.
  return flatten_onto(parameters_device(), stream, std::move(layout));
}

ParameterStore& Module::flat_parameters(const Stream& stream) {
  return store_ != nullptr ? *store_ : flatten_parameters(stream);
}

ParameterStore& Module::flatten_onto(const Device& device, const Stream& stream, std::vector<std::size_t> layout) {
  set_device(device);
  const NamedTensors parameters = named_parameters();
  if (store_ != nullptr && store_->holds(parameters)) {
    // In place: an optimizer or DDP holding the store sees a new layout instead of a dangling reference.
    if (device != store_->device()) {
      store_->move_to(device, std::move(layout), stream);
    } else {
      store_->relayout(std::move(layout), stream);
    }
    return *store_;
  }
  // A first store, or parameters registered since the last one: the new store copies from wherever they are.
  store_ = std::make_shared<ParameterStore>(parameters, device, stream, std::move(layout));
  return *store_;
}

void Module::zero_grad(const Stream& stream) {
  if (store_ != nullptr) {
    store_->zero_grad(stream);
    return;
  }
  autograd::zero_grad(parameters());
}

}  // namespace ddp
