// Standalone activations: kernels::activation_forward/backward, float32.
#include "runtime/ops/activation.h"

#include "runtime/kernels/dispatch.h"
#include "runtime/ops/op_checks.h"
#include "runtime/autograd/autograd.h"

namespace ddp::ops {

Tensor activation(const Tensor& x, Activation act, const Stream& stream) {
  constexpr const char* kOp = "activation";
  detail::check_defined(kOp, "x", x);
  detail::check_dtype(kOp, "x", x, DType::kFloat32);
  detail::check_stream(kOp, x, stream);
  const Device device = x.device();
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32, device, stream);
  DDP_DISPATCH(device, activation_forward, act, x.data<float>(), y.data<float>(), x.numel(), stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record(activation_name(act), {x}, {y}, [x, y, act, device](const Stream& s) {
      Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      autograd::GradTarget gx = autograd::grad_target(x, s);
      if (!gx.grad.defined()) return;
      DDP_DISPATCH(device, activation_backward, act, x.data<float>(), y.data<float>(), dy.data<float>(),
                   gx.grad.data<float>(), x.numel(), gx.accumulate, s.handle());
    });
  }
  return y;
}

}  // namespace ddp::ops
