// linear() and linear_mixed(): forward through kernels::linear_forward, backward through one
// kernels::linear_backward call that writes dw/db straight into the parameters' gradient views.
#include "ops/linear.h"

#include "runtime/kernels/dispatch.h"
#include "ops/op_checks.h"
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

// What one Linear's backward will need, with its outputs allocated (y, and pre for GELU).
SavedLinear saved_linear(const Tensor& x, const Tensor& w, const Tensor& w_target, const Tensor& b_target,
                         Activation act, DType out_dtype, const Stream& stream, MathMode math) {
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
  return l;
}

// The forward kernel of one Linear, and what its backward will need.
SavedLinear forward_linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& w_target,
                           const Tensor& b_target, Activation act, DType out_dtype, const Stream& stream,
                           MathMode math) {
  SavedLinear l = saved_linear(x, w, w_target, b_target, act, out_dtype, stream, math);
  DDP_DISPATCH(x.device(), linear_forward, l.types, math, l.shape, x.data_ptr(), w.data_ptr(),
               bias.defined() ? bias.data_ptr() : nullptr, act, l.y.data_ptr(),
               l.pre.defined() ? l.pre.data_ptr() : nullptr, stream.handle());
  return l;
}

// One Linear's backward from dy: the weight and bias gradients into the targets' gradients, and dx into `dx` when
// it is defined (overwritten) or else into x's gradient; `through` as in kernels::linear_backward.
void backward_linear(const SavedLinear& l, const Tensor& dy, const Tensor& dx,
                     const kernels::InputActivation* through, const Stream& s) {
  const Device device = l.x.device();
  autograd::GradTarget gx = dx.defined() ? autograd::GradTarget{dx, false} : autograd::grad_target(l.x, s);
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
               scratch.defined() ? scratch.data_ptr() : nullptr, s.handle(), through);
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
      if (dy.defined()) backward_linear(l, dy, Tensor(), nullptr, s);
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

Tensor linear_chain(const Tensor& x, const std::vector<ChainLayer>& layers, const std::vector<Activation>& activations,
                    const Stream& stream, MathMode math) {
  constexpr const char* kOp = "linear_chain";
  const std::size_t n = layers.size();
  DDP_CHECK(n >= 1, "linear_chain: needs at least one layer");
  DDP_CHECK(activations.size() + 1 == n, "linear_chain: " + std::to_string(n) + " layers need " +
                                             std::to_string(n - 1) + " activations (one between each two), got " +
                                             std::to_string(activations.size()));
  detail::check_defined(kOp, "x", x);
  DDP_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16,
            "linear_chain: x must be float32 or bfloat16, got " + x.describe());
  std::int64_t features = x.dim() == 2 ? x.size(1) : -1;
  for (std::size_t l = 0; l < n; ++l) {
    const Tensor& w = layers[l].weight;
    const std::string which = "layer " + std::to_string(l);
    detail::check_defined(kOp, (which + "'s weight").c_str(), w);
    DDP_CHECK(w.dtype() == x.dtype(),
              "linear_chain: " + which + "'s weight is " + w.describe() + ", x is " + dtype_name(x.dtype()) +
                  " (one type throughout)");
    if (l == 0) {
      check_x_and_weight(kOp, x, w);
    } else {
      DDP_CHECK(w.dim() == 2 && w.size(1) == features,
                "linear_chain: " + which + "'s weight must be [out, " + std::to_string(features) +
                    "] (layer " + std::to_string(l - 1) + " has " + std::to_string(features) + " outputs), got " +
                    w.describe());
      detail::check_same_device(kOp, x, "x", w, (which + "'s weight").c_str());
    }
    check_bias(kOp, x, layers[l].bias, w.size(0), w.dtype());
    features = w.size(0);
  }
  detail::check_stream(kOp, x, stream);

  // Forward: the layers before the last two one by one, then the last two as a pair.
  std::vector<SavedLinear> saved;
  saved.reserve(n);
  Tensor h = x;
  for (std::size_t l = 0; l + 2 < n; ++l) {
    const ChainLayer& layer = layers[l];
    saved.push_back(forward_linear(h, layer.weight, layer.bias, layer.weight, layer.bias, activations[l], x.dtype(),
                                   stream, math));
    h = saved.back().y;
  }
  if (n == 1) {
    saved.push_back(forward_linear(h, layers[0].weight, layers[0].bias, layers[0].weight, layers[0].bias,
                                   Activation::kNone, x.dtype(), stream, math));
  } else {
    const ChainLayer &hidden = layers[n - 2], &head = layers[n - 1];
    const Activation act = activations[n - 2];
    saved.push_back(saved_linear(h, hidden.weight, hidden.weight, hidden.bias, act, x.dtype(), stream, math));
    saved.push_back(saved_linear(saved[n - 2].y, head.weight, head.weight, head.bias, Activation::kNone, x.dtype(),
                                 stream, math));
    const SavedLinear &first = saved[n - 2], &second = saved[n - 1];
    DDP_DISPATCH(x.device(), linear_pair_forward, x.dtype(), math, first.shape, second.shape.out, h.data_ptr(),
                 hidden.weight.data_ptr(), hidden.bias.defined() ? hidden.bias.data_ptr() : nullptr, act,
                 first.y.data_ptr(), first.pre.defined() ? first.pre.data_ptr() : nullptr, head.weight.data_ptr(),
                 head.bias.defined() ? head.bias.data_ptr() : nullptr, second.y.data_ptr(), stream.handle());
  }
  const Tensor y = saved.back().y;

  // The parameters last layer first: at the latest their grad-ready hooks fire in this order.
  std::vector<Tensor> inputs{x};
  bool record = autograd::should_record({&x});
  for (std::size_t l = n; l-- > 0;) {
    inputs.push_back(layers[l].weight);
    inputs.push_back(layers[l].bias);
    record = record || autograd::should_record({&layers[l].weight, &layers[l].bias});
  }
  if (record) {
    autograd::record(kOp, std::move(inputs), {y}, [saved](const Stream& s) {
      Tensor dy = autograd::grad_of(saved.back().y, s);
      if (!dy.defined()) return;
      for (std::size_t l = saved.size(); l-- > 0;) {
        // Below the last layer, the layer's activation and bias gradient were taken by the layer above (`through`).
        SavedLinear layer = saved[l];
        if (l + 1 < saved.size()) {
          layer.act = Activation::kNone;
          layer.b_target = Tensor();
        }
        if (l == 0) {
          backward_linear(layer, dy, Tensor(), nullptr, s);  // dx into x's gradient, when x wants one
        } else {
          // dx through the activation below into that layer's dz, with that layer's bias gradient.
          const SavedLinear& below = saved[l - 1];
          autograd::GradTarget gb = autograd::grad_target(below.b_target, s);
          const kernels::InputActivation through{
              below.act, below.act == Activation::kGelu ? below.pre.data_ptr() : below.y.data_ptr(),
              gb.grad.defined() ? gb.grad.data_ptr() : nullptr, gb.accumulate};
          Tensor dz = Tensor::empty(below.y.shape(), layer.types.input, below.y.device(), s);
          backward_linear(layer, dy, dz, &through, s);
          dy = dz;
        }
        autograd::gradients_written({&saved[l].w_target, &saved[l].b_target});
      }
    });
  }
  return y;
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
