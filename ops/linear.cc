// linear(): forward through kernels::linear_forward, backward through one kernels::linear_backward call that
// writes dw/db straight into the parameters' gradient views.
#include "ops/linear.h"

#include "ops/dispatch.h"
#include "ops/op_checks.h"
#include "runtime/autograd/autograd.h"

namespace ddp::ops {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, const Stream& stream,
              MathMode math) {
  constexpr const char* kOp = "linear";
  detail::check_defined(kOp, "x", x);
  detail::check_defined(kOp, "weight", w);
  DDP_CHECK(w.dim() == 2, "linear: weight must be [out, in], got " + w.describe());
  DDP_CHECK(x.dim() == 2, "linear: x must be [batch, features], got " + x.describe());
  const std::int64_t out = w.size(0), in = w.size(1);
  DDP_CHECK(x.size(1) == in, "linear: x has " + std::to_string(x.size(1)) + " features, weight expects " +
                                 std::to_string(in) + " (x " + shape_str(x.shape()) + ", weight " +
                                 shape_str(w.shape()) + ")");
  DDP_CHECK(x.dtype() == w.dtype() && (x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16),
            "linear: x and weight must both be float32 or both bfloat16, got " + x.describe() + " and " +
                w.describe());
  detail::check_same_device(kOp, x, "x", w, "weight");
  if (b.defined()) {
    DDP_CHECK(b.dim() == 1 && b.size(0) == out, "linear: bias must be [" + std::to_string(out) + "], got " +
                                                    shape_str(b.shape()));
    DDP_CHECK(b.dtype() == w.dtype(), "linear: bias is " + b.describe() + ", weight is " + w.describe());
    detail::check_same_device(kOp, x, "x", b, "bias");
  }
  detail::check_stream(kOp, x, stream);

  const DType dtype = x.dtype();
  const Device device = x.device();
  const kernels::LinearShape shape{x.size(0), in, out};
  Tensor y = Tensor::empty({shape.batch, out}, dtype, device, stream);
  // GELU's backward needs x·wᵀ+b; ReLU's is computed from y.
  Tensor pre = act == Activation::kGelu ? Tensor::empty({shape.batch, out}, dtype, device, stream) : Tensor();
  DDP_DISPATCH(device, linear_forward, dtype, math, shape, x.data_ptr(), w.data_ptr(),
               b.defined() ? b.data_ptr() : nullptr, act, y.data_ptr(), pre.defined() ? pre.data_ptr() : nullptr,
               stream.handle());

  if (autograd::should_record({&x, &w, &b})) {
    autograd::record(
        "linear", {x, w, b}, {y}, [x, w, b, y, pre, act, math, shape, dtype, device](const Stream& s) {
          Tensor dy = autograd::grad_of(y);
          if (!dy.defined()) return;
          autograd::GradTarget gx = autograd::grad_target(x, s);
          autograd::GradTarget gw = autograd::grad_target(w, s);
          autograd::GradTarget gb = autograd::grad_target(b, s);
          // The kernel has one accumulate flag for dw and db: when only one of them is valid, zero the other
          // and accumulate into both (rare: parameters are zeroed together).
          bool accumulate = gw.grad.defined() ? gw.accumulate : gb.accumulate;
          if (gw.grad.defined() && gb.grad.defined() && gw.accumulate != gb.accumulate) {
            (gw.accumulate ? gb : gw).grad.zero_(s);
            accumulate = true;
          }
          if (!gw.grad.defined() && gb.grad.defined()) accumulate = gb.accumulate;
          // dx is always overwritten by the kernel: accumulate through a temporary when x already has one.
          Tensor dx_out;
          if (gx.grad.defined()) {
            DDP_CHECK(!gx.accumulate || dtype == DType::kFloat32,
                      "linear backward: accumulating a bfloat16 input gradient is not supported");
            dx_out = gx.accumulate ? Tensor::empty(x.shape(), dtype, device, s) : gx.grad;
          }
          Tensor scratch =
              act != Activation::kNone ? Tensor::empty({shape.batch, shape.out}, dtype, device, s) : Tensor();
          DDP_DISPATCH(device, linear_backward, dtype, math, shape, dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                       y.data_ptr(), pre.defined() ? pre.data_ptr() : nullptr, act,
                       dx_out.defined() ? dx_out.data_ptr() : nullptr,
                       gw.grad.defined() ? gw.grad.data_ptr() : nullptr,
                       gb.grad.defined() ? gb.grad.data_ptr() : nullptr, accumulate,
                       scratch.defined() ? scratch.data_ptr() : nullptr, s.handle());
          if (gx.grad.defined() && gx.accumulate) {
            DDP_DISPATCH(device, axpby, dx_out.data<float>(), gx.grad.data<float>(), dx_out.numel(), 1.0f, 1.0f,
                         s.handle());
          }
        });
  }
  return y;
}

}  // namespace ddp::ops
