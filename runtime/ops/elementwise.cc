// Elementwise arithmetic and the differentiable device copy: kernels::add / mul / axpby through the dispatch,
// backwards written through autograd::grad_target (overwrite on the first write of a backward, then accumulate).
#include "runtime/ops/elementwise.h"

#include <string>

#include "runtime/autograd/autograd.h"
#include "runtime/kernels/dispatch.h"
#include "runtime/ops/op_checks.h"

namespace ddp::ops {
namespace {

void check_pair(const char* op, const Tensor& a, const Tensor& b, const Stream& stream) {
  detail::check_float_input(op, "a", a, stream);
  detail::check_float_input(op, "b", b, stream);
  detail::check_same_device(op, a, "a", b, "b");
  DDP_CHECK(a.shape() == b.shape(),
            std::string(op) + ": the inputs must have one shape, got " + a.describe() + " and " + b.describe());
}

// grad(input) (+)= alpha · dy, on `s`.
void add_scaled_grad(const Tensor& input, const Tensor& dy, float alpha, const Stream& s) {
  autograd::GradTarget target = autograd::grad_target(input, s);
  if (!target.grad.defined()) return;
  DDP_DISPATCH(dy.device(), axpby, dy.data<float>(), target.grad.data<float>(), dy.numel(), alpha,
               target.accumulate ? 1.0f : 0.0f, s.handle());
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, const Stream& stream) {
  check_pair("add", a, b, stream);
  const Device device = a.device();
  Tensor y = Tensor::empty(a.shape(), DType::kFloat32, device, stream);
  DDP_DISPATCH(device, add, a.data<float>(), b.data<float>(), y.data<float>(), y.numel(), stream.handle());
  if (autograd::should_record({&a, &b})) {
    autograd::record("add", {a, b}, {y}, [a, b, y](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      add_scaled_grad(a, dy, 1.0f, s);
      add_scaled_grad(b, dy, 1.0f, s);
    });
  }
  return y;
}

Tensor scale(const Tensor& x, double alpha, const Stream& stream) {
  detail::check_float_input("scale", "x", x, stream);
  const Device device = x.device();
  const auto factor = static_cast<float>(alpha);
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32, device, stream);
  DDP_DISPATCH(device, axpby, x.data<float>(), y.data<float>(), y.numel(), factor, 0.0f, stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record("scale", {x}, {y}, [x, y, factor](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (dy.defined()) add_scaled_grad(x, dy, factor, s);
    });
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b, const Stream& stream) {
  check_pair("mul", a, b, stream);
  const Device device = a.device();
  Tensor y = Tensor::empty(a.shape(), DType::kFloat32, device, stream);
  DDP_DISPATCH(device, mul, a.data<float>(), b.data<float>(), y.data<float>(), y.numel(), false, stream.handle());
  if (autograd::should_record({&a, &b})) {
    autograd::record("mul", {a, b}, {y}, [a, b, y, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      // d(a⊙b)/da = b and d(a⊙b)/db = a: each input's gradient is dy times the other input.
      auto add_grad_times = [&](const Tensor& input, const Tensor& other) {
        autograd::GradTarget target = autograd::grad_target(input, s);
        if (!target.grad.defined()) return;
        DDP_DISPATCH(device, mul, dy.data<float>(), other.data<float>(), target.grad.data<float>(), dy.numel(),
                     target.accumulate, s.handle());
      };
      add_grad_times(a, b);
      add_grad_times(b, a);
    });
  }
  return y;
}

Tensor to_device(const Tensor& x, const Device& device, const Stream& stream) {
  constexpr const char* kOp = "to_device";
  detail::check_defined(kOp, "x", x);
  const Device from = x.device();
  if (from.is_cuda() || device.is_cuda()) {
    DDP_CHECK(stream.device().is_cuda(), std::string(kOp) + ": copying " + x.describe() + " to " + device.str() +
                                             " needs a CUDA stream, got the CPU stream");
  }
  Tensor y = x.copy_to(device, stream);
  if (autograd::should_record({&x})) {
    autograd::record(kOp, {x}, {y}, [x, y, from](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      if (from.is_cuda() || dy.device().is_cuda()) {
        DDP_CHECK(s.device().is_cuda(), "to_device: the gradient of a copy from " + from.str() + " to " +
                                            dy.device().str() +
                                            " goes back across devices, which needs backward on a CUDA stream; "
                                            "run backward on a stream of the GPU");
      }
      autograd::GradTarget target = autograd::grad_target(x, s);
      if (!target.grad.defined()) return;
      const Tensor back = dy.device() == from ? dy : dy.copy_to(from, s);
      if (from.is_cpu() && dy.device().is_cuda()) s.synchronize();  // the pinned copy is read on the host below
      if (target.accumulate) {
        target.grad.add_(back, s);
      } else {
        target.grad.copy_from(back, s);
      }
    });
  }
  return y;
}

}  // namespace ddp::ops
