// linear() and linear_mixed(): forward through kernels::linear_forward, backward through one
// kernels::linear_backward call that writes dw/db straight into the parameters' gradient views.
#include "runtime/ops/linear.h"

#include "runtime/kernels/dispatch.h"
#include "runtime/ops/op_checks.h"
#include "runtime/autograd/autograd.h"

namespace ddp::ops {
namespace {

// What one Linear's backward needs from its forward. The GEMMs read `w`; the weight and bias gradients go to
// `w_target` and `b_target` (the same tensors for linear(), the float32 masters for linear_mixed()), whose dtype
// is the gradients' type.
struct SavedLinear {
  Tensor x, w, w_target, b_target, y, pre;  // pre: x·wᵀ+b, kept for GELU's backward only
  Activation act = Activation::kNone;
  MathMode math = MathMode::kFloat32;
  kernels::LinearShape shape;
  kernels::LinearTypes types;
};

// The forward kernel of one Linear, and what its backward will need (y, and pre for GELU).
SavedLinear forward_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& w_target,
                           const Tensor& b_target, Activation act, DType out_dtype, const Stream& stream,
                           MathMode math) {
  if (!fused_activation(act)) {
    throw InvalidArgument("linear: only ReLU and GELU fuse into a Linear; apply ops::activation (tanh, sigmoid) to "
                          "its output instead");
  }
  const std::int64_t out = w.size(0), in = w.size(1);
  SavedLinear l{x, w, w_target, b_target, Tensor(), Tensor(), act, math, kernels::LinearShape{x.size(0), in, out},
                kernels::LinearTypes(x.dtype(), out_dtype, w_target.dtype())};
  l.y = Tensor::empty({l.shape.batch, out}, out_dtype, x.device(), stream);
  // GELU's backward needs x·wᵀ+b; ReLU's is computed from y.
  if (act == Activation::kGelu) l.pre = Tensor::empty({l.shape.batch, out}, out_dtype, x.device(), stream);
  DDP_DISPATCH(x.device(), linear_forward, l.types, math, l.shape, x.data_ptr(), w.data_ptr(),
               bias.defined() ? bias.data_ptr() : nullptr, act, l.y.data_ptr(),
               l.pre.defined() ? l.pre.data_ptr() : nullptr, stream.handle());
  return l;
}

// One Linear's backward from dy: the weight and bias gradients into the targets' gradients, dx into x's.
void backward_linear(const SavedLinear& l, const Tensor& dy, const Stream& s) {
  const Device device = l.x.device();
  autograd::GradTarget gx = autograd::grad_target(l.x, s);
  autograd::GradTarget gw = autograd::grad_target(l.w_target, s);
  autograd::GradTarget gb = autograd::grad_target(l.b_target, s);  // none when b_target is undefined
  // The kernel has one accumulate flag for dw and db: when only one of them is valid, zero the other and
  // accumulate into both (rare: parameters are zeroed together).
  bool accumulate = gw.grad.defined() ? gw.accumulate : gb.accumulate;
  if (gw.grad.defined() && gb.grad.defined() && gw.accumulate != gb.accumulate) {
    (gw.accumulate ? gb : gw).grad.zero_(s);
    accumulate = true;
  }
  if (!gw.grad.defined() && gb.grad.defined()) accumulate = gb.accumulate;
  // dx is always overwritten by the kernel: accumulate through a temporary when x already has one.
  Tensor dx_out;
  if (gx.grad.defined()) {
    DDP_CHECK(!gx.accumulate || l.types.input == DType::kFloat32,
              "linear backward: accumulating a bfloat16 input gradient is not supported");
    dx_out = gx.accumulate ? Tensor::empty(l.x.shape(), l.types.input, device, s) : gx.grad;
  }
  // dz (input type) when there is an activation to differentiate or dy to convert.
  Tensor scratch = l.act != Activation::kNone || l.types.output != l.types.input
                       ? Tensor::empty({l.shape.batch, l.shape.out}, l.types.input, device, s)
                       : Tensor();
  DDP_DISPATCH(device, linear_backward, l.types, l.math, l.shape, dy.data_ptr(), l.x.data_ptr(), l.w.data_ptr(),
               l.y.data_ptr(), l.pre.defined() ? l.pre.data_ptr() : nullptr, l.act,
               dx_out.defined() ? dx_out.data_ptr() : nullptr, gw.grad.defined() ? gw.grad.data_ptr() : nullptr,
               gb.grad.defined() ? gb.grad.data_ptr() : nullptr, accumulate,
               scratch.defined() ? scratch.data_ptr() : nullptr, s.handle());
  if (gx.grad.defined() && gx.accumulate) {
    DDP_DISPATCH(device, axpby, dx_out.data<float>(), gx.grad.data<float>(), dx_out.numel(), 1.0f, 1.0f,
                 s.handle());
  }
}

// Both ops: the forward, and its backward on the tape.
Tensor linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& w_target,
                   const Tensor& b_target, Activation act, DType out_dtype, const Stream& stream, MathMode math) {
  const SavedLinear l = forward_linear(x, w, bias, w_target, b_target, act, out_dtype, stream, math);
  if (autograd::should_record({&x, &w_target, &b_target})) {
    autograd::record("linear", {x, w_target, b_target}, {l.y}, [l](const Stream& s) {
      Tensor dy = autograd::grad_of(l.y, s);
      if (dy.defined()) backward_linear(l, dy, s);
    });
  }
  return l.y;
}

void check_x_and_weight(const char* op, const Tensor& x, const Tensor& w) {
  detail::check_defined(op, "x", x);
  detail::check_defined(op, "weight", w);
  DDP_CHECK(w.dim() == 2, std::string(op) + ": weight must be [out, in], got " + w.describe());
  DDP_CHECK(x.dim() == 2, std::string(op) + ": x must be [batch, features], got " + x.describe());
  DDP_CHECK(x.size(1) == w.size(1), std::string(op) + ": x has " + std::to_string(x.size(1)) +
                                        " features, weight expects " + std::to_string(w.size(1)) + " (x " +
                                        shape_str(x.shape()) + ", weight " + shape_str(w.shape()) + ")");
  detail::check_same_device(op, x, "x", w, "weight");
}

void check_bias(const char* op, const Tensor& x, const Tensor& b, std::int64_t out, DType dtype) {
  if (!b.defined()) return;
  DDP_CHECK(b.dim() == 1 && b.size(0) == out,
            std::string(op) + ": bias must be [" + std::to_string(out) + "], got " + shape_str(b.shape()));
  DDP_CHECK(b.dtype() == dtype, std::string(op) + ": bias is " + b.describe() + ", expected " + dtype_name(dtype));
  detail::check_same_device(op, x, "x", b, "bias");
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, const Stream& stream,
              MathMode math) {
  constexpr const char* kOp = "linear";
  check_x_and_weight(kOp, x, w);
  DDP_CHECK(x.dtype() == w.dtype() && (x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16),
            "linear: x and weight must both be float32 or both bfloat16, got " + x.describe() + " and " +
                w.describe());
  check_bias(kOp, x, b, w.size(0), w.dtype());
  detail::check_stream(kOp, x, stream);
  return linear_impl(x, w, b, w, b, act, x.dtype(), stream, math);
}

Tensor linear_mixed(const Tensor& x, const Tensor& w, const Tensor& w_bf16, const Tensor& b, const Tensor& b_bf16,
                    Activation act, DType out_dtype, const Stream& stream) {
  constexpr const char* kOp = "linear_mixed";
  check_x_and_weight(kOp, x, w_bf16);
  detail::check_defined(kOp, "master weight", w);
  DDP_CHECK(x.dtype() == DType::kBFloat16 && w_bf16.dtype() == DType::kBFloat16 && w.dtype() == DType::kFloat32,
            "linear_mixed: needs bfloat16 x and weight copy and a float32 master weight, got x " + x.describe() +
                ", copy " + w_bf16.describe() + ", master " + w.describe());
  DDP_CHECK(w.shape() == w_bf16.shape(), "linear_mixed: master weight " + w.describe() + " and its copy " +
                                             w_bf16.describe() + " differ in shape");
  DDP_CHECK(out_dtype == DType::kFloat32 || out_dtype == DType::kBFloat16,
            std::string("linear_mixed: out_dtype must be float32 or bfloat16, got ") + dtype_name(out_dtype));
  DDP_CHECK(b.defined() == b_bf16.defined(), "linear_mixed: give both the master bias and its copy, or neither");
  const std::int64_t out = w.size(0);
  check_bias(kOp, x, b, out, DType::kFloat32);
  check_bias(kOp, x, b_bf16, out, DType::kBFloat16);
  detail::check_stream(kOp, x, stream);
  // The bias the GEMM adds has the output's type (cuBLASLt's rule): the master itself for a float32 output.
  const Tensor& bias = out_dtype == DType::kFloat32 ? b : b_bf16;
  return linear_impl(x, w_bf16, bias, w, b, act, out_dtype, stream, MathMode::kFloat32);
}

}  // namespace ddp::ops
