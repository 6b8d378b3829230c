// Bf16Weights: the flat bfloat16 copy of a ParameterStore and the autograd casts between it and the FP32
// master parameters.
#include "runtime/models/bf16_weights.h"

#include <string>

#include "runtime/kernels/dispatch.h"
#include "runtime/ops/linear.h"
#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/core/phase.h"

namespace ddp {
namespace {

// Writes cast(src) into target (overwrite) or adds it (accumulate), float32 target.
void cast_into_grad(const Tensor& src, const autograd::GradTarget& target, const Stream& s) {
  const Device device = target.grad.device();
  const std::int64_t n = target.grad.numel();
  if (!target.accumulate) {
    DDP_DISPATCH(device, cast, src.dtype(), src.data_ptr(), target.grad.dtype(), target.grad.data_ptr(), n,
                 s.handle());
    return;
  }
  DDP_CHECK(target.grad.dtype() == DType::kFloat32, "cast backward: accumulating needs a float32 gradient");
  Tensor tmp = Tensor::empty(target.grad.shape(), DType::kFloat32, device, s);
  DDP_DISPATCH(device, cast, src.dtype(), src.data_ptr(), DType::kFloat32, tmp.data_ptr(), n, s.handle());
  DDP_DISPATCH(device, axpby, tmp.data<float>(), target.grad.data<float>(), n, 1.0f, 1.0f, s.handle());
}

}  // namespace

Bf16Weights::Bf16Weights(const ParameterStore& store, const Stream& stream)
    : store_(store), layout_version_(store.layout_version()) {
  flat_ = Tensor::empty({store.total_numel()}, DType::kBFloat16, store.device(), stream);
  refresh(stream);
}

void Bf16Weights::check_layout() const {
  DDP_CHECK(store_.layout_version() == layout_version_,
            "Bf16Weights was made for an older layout of the parameters (DistributedDataParallel lays them out in "
            "bucket order, moving a model re-lays them): make it after DistributedDataParallel and the last move");
}

void Bf16Weights::refresh(const Stream& stream) {
  check_layout();
  const Tensor& p = store_.flat_params();
  DDP_DISPATCH(p.device(), cast, DType::kFloat32, p.data_ptr(), DType::kBFloat16, flat_.data_ptr(), p.numel(),
               stream.handle());
}

std::size_t Bf16Weights::index_of(const Tensor& param) const {
  for (std::size_t i = 0; i < store_.size(); ++i)
    if (store_.slot(i).param.same(param)) return i;
  throw Error("Bf16Weights: " + param.describe() + " is not a parameter of the store");
}

Tensor Bf16Weights::copy(std::size_t index) const {
  check_layout();
  const ParameterSlot& slot = store_.slot(index);
  return flat_.flat_slice(slot.offset, slot.shape);
}

Tensor Bf16Weights::weight(std::size_t index) const {
  check_layout();
  const ParameterSlot& slot = store_.slot(index);
  Tensor copy = flat_.flat_slice(slot.offset, slot.shape);
  Tensor param = slot.param;
  if (autograd::should_record({&param})) {
    autograd::record("bf16_weight", {param}, {copy}, [param, copy](const Stream& s) {
      Tensor g = autograd::grad_of(copy, s);
      if (!g.defined()) return;
      cast_into_grad(g, autograd::grad_target(param, s), s);
    });
  }
  return copy;
}

Tensor cast(const Tensor& x, DType dtype, const Stream& stream) {
  DDP_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16,
            "cast: only float32 <-> bfloat16, got " + x.describe());
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device(), stream);
  DDP_DISPATCH(x.device(), cast, x.dtype(), x.data_ptr(), dtype, y.data_ptr(), x.numel(), stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record("cast", {x}, {y}, [x, y](const Stream& s) {
      Tensor g = autograd::grad_of(y, s);
      if (!g.defined()) return;
      autograd::GradTarget t = autograd::grad_target(x, s);
      DDP_CHECK(!t.accumulate || t.grad.dtype() == DType::kFloat32,
                "cast backward: accumulating a bfloat16 gradient is not supported");
      cast_into_grad(g, t, s);
    });
  }
  return y;
}

Tensor forward_bf16(const Sequential& model, const Bf16Weights& weights, const Tensor& x, const Stream& stream,
                    DType logits_dtype) {
  PhaseGuard phase(Phase::kForward);
  DDP_CHECK(logits_dtype == DType::kFloat32 || logits_dtype == DType::kBFloat16,
            std::string("forward_bf16: logits must be float32 or bfloat16, got ") + dtype_name(logits_dtype));
  Tensor h = cast(x, DType::kBFloat16, stream);
  const auto& kids = model.children();
  std::size_t last_linear = kids.size();
  for (std::size_t i = 0; i < kids.size(); ++i)
    if (dynamic_cast<Linear*>(kids[i].second.get()) != nullptr) last_linear = i;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    auto* linear = dynamic_cast<Linear*>(kids[i].second.get());
    DDP_CHECK(linear != nullptr || dynamic_cast<ActivationLayer*>(kids[i].second.get()) != nullptr,
              "forward_bf16: only Linear and activation layers are supported, got " + kids[i].second->type_name());
    DDP_CHECK(linear != nullptr, "forward_bf16: an activation must follow a Linear (it is fused into it)");
    auto* act = i + 1 < kids.size() ? dynamic_cast<ActivationLayer*>(kids[i + 1].second.get()) : nullptr;
    if (act != nullptr && !fused_activation(act->activation())) {
      throw InvalidArgument("bf16 training takes ReLU and GELU activations, not " + act->type_name() +
                            "; train in fp32 or tf32, or use relu or gelu");
    }
    const Tensor& w = linear->weight();
    const Tensor& b = linear->bias();
    const Tensor b_copy = b.defined() ? weights.copy(weights.index_of(b)) : Tensor();
    h = ops::linear_mixed(h, w, weights.copy(weights.index_of(w)), b, b_copy,
                          act != nullptr ? act->activation() : Activation::kNone,
                          i == last_linear ? logits_dtype : DType::kBFloat16, stream);
    if (act != nullptr) ++i;
  }
  return h;
}

}  // namespace ddp
