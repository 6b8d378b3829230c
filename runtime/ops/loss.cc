// Losses and metrics over the kernels of the contract. The loss kernels produce the gradient in the forward
// pass; backward hands that tensor to the logits without a copy when it can (autograd::adopt_grad).
#include "runtime/ops/loss.h"

#include "runtime/kernels/dispatch.h"
#include "runtime/ops/op_checks.h"
#include "runtime/autograd/autograd.h"

namespace ddp::ops {
namespace {

// Passes the saved gradient `g` of the mean loss on to `input`, scaled by the loss' own gradient.
void propagate_saved_grad(const Tensor& loss, const Tensor& input, const Tensor& g, const Stream& s) {
  const double upstream = autograd::scalar_grad_value(loss, s);
  const Device device = input.device();
  if (g.dtype() != DType::kFloat32) {
    // bfloat16 logits (mixed precision): the saved gradient is handed over as is; scaling or adding it to an
    // existing gradient would need float32 here.
    DDP_CHECK(upstream == 1.0 && autograd::adopt_grad(input, g),
              "cross_entropy on bfloat16 logits: backward must start at this loss and the logits must have no "
              "other gradient; compute the logits in float32 (forward_bf16(..., DType::kFloat32)) otherwise");
    return;
  }
  if (upstream != 1.0) DDP_DISPATCH(device, scale, g.data<float>(), g.numel(), static_cast<float>(upstream), s.handle());
  if (autograd::adopt_grad(input, g)) return;
  autograd::GradTarget t = autograd::grad_target(input, s);
  DDP_DISPATCH(device, axpby, g.data<float>(), t.grad.data<float>(), g.numel(), 1.0f, t.accumulate ? 1.0f : 0.0f,
               s.handle());
}

void check_logits_labels(const char* op, const Tensor& logits, const Tensor& labels, const Stream& stream,
                         bool allow_bf16 = false) {
  detail::check_defined(op, "logits", logits);
  detail::check_defined(op, "labels", labels);
  if (!allow_bf16 || logits.dtype() != DType::kBFloat16) detail::check_dtype(op, "logits", logits, DType::kFloat32);
  detail::check_dtype(op, "labels", labels, DType::kInt32);
  DDP_CHECK(logits.dim() == 2, std::string(op) + ": logits must be [batch, classes], got " + logits.describe());
  DDP_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0),
            std::string(op) + ": labels " + shape_str(labels.shape()) + " do not match logits " +
                shape_str(logits.shape()) + " (one label per row)");
  detail::check_same_device(op, logits, "logits", labels, "labels");
  detail::check_stream(op, logits, stream);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, const Stream& stream) {
  check_logits_labels("cross_entropy", logits, labels, stream, /*allow_bf16=*/true);
  const Device device = logits.device();
  const std::int64_t batch = logits.size(0), classes = logits.size(1);
  Tensor loss = Tensor::empty({}, DType::kFloat32, device, stream);
  const bool record = autograd::should_record({&logits});
  Tensor dlogits = record ? Tensor::empty(logits.shape(), logits.dtype(), device, stream) : Tensor();
  DDP_DISPATCH(device, softmax_cross_entropy, logits.dtype(), logits.data_ptr(), labels.data<std::int32_t>(), batch,
               classes, loss.data<float>(), record ? dlogits.data_ptr() : nullptr, stream.handle());
  if (record) {
    autograd::record("cross_entropy", {logits}, {loss}, [logits, loss, dlogits](const Stream& s) {
      propagate_saved_grad(loss, logits, dlogits, s);
    });
  }
  return loss;
}

Tensor mse_loss(const Tensor& pred, const Tensor& target, const Stream& stream) {
  constexpr const char* kOp = "mse_loss";
  detail::check_defined(kOp, "pred", pred);
  detail::check_defined(kOp, "target", target);
  detail::check_dtype(kOp, "pred", pred, DType::kFloat32);
  detail::check_dtype(kOp, "target", target, DType::kFloat32);
  DDP_CHECK(pred.shape() == target.shape(), "mse_loss: pred " + shape_str(pred.shape()) + " and target " +
                                                shape_str(target.shape()) + " differ in shape");
  detail::check_same_device(kOp, pred, "pred", target, "target");
  detail::check_stream(kOp, pred, stream);
  const Device device = pred.device();
  Tensor loss = Tensor::empty({}, DType::kFloat32, device, stream);
  const bool record = autograd::should_record({&pred});
  Tensor dpred = record ? Tensor::empty(pred.shape(), DType::kFloat32, device, stream) : Tensor();
  DDP_DISPATCH(device, mse_loss, pred.data<float>(), target.data<float>(), pred.numel(), loss.data<float>(),
               record ? dpred.data<float>() : nullptr, stream.handle());
  if (record) {
    autograd::record("mse_loss", {pred}, {loss}, [pred, loss, dpred](const Stream& s) {
      propagate_saved_grad(loss, pred, dpred, s);
    });
  }
  return loss;
}

Tensor argmax(const Tensor& logits, const Stream& stream) {
  detail::check_defined("argmax", "logits", logits);
  detail::check_dtype("argmax", "logits", logits, DType::kFloat32);
  DDP_CHECK(logits.dim() == 2 && logits.size(1) > 0, "argmax: logits must be [batch, classes], got " + logits.describe());
  detail::check_stream("argmax", logits, stream);
  Tensor out = Tensor::empty({logits.size(0)}, DType::kInt32, logits.device(), stream);
  DDP_DISPATCH(logits.device(), argmax_rows, logits.data<float>(), logits.size(0), logits.size(1),
               out.data<std::int32_t>(), stream.handle());
  return out;
}

Tensor count_correct(const Tensor& logits, const Tensor& labels, const Stream& stream) {
  check_logits_labels("count_correct", logits, labels, stream);
  Tensor out = Tensor::empty({}, DType::kInt64, logits.device(), stream);
  DDP_DISPATCH(logits.device(), count_correct, logits.data<float>(), labels.data<std::int32_t>(), logits.size(0),
               logits.size(1), out.data<std::int64_t>(), stream.handle());
  return out;
}

double accuracy(const Tensor& logits, const Tensor& labels, const Stream& stream) {
  const std::int64_t batch = logits.defined() && logits.dim() == 2 ? logits.size(0) : 0;
  Tensor correct = count_correct(logits, labels, stream);
  if (batch == 0) return 0.0;
  return static_cast<double>(correct.to_vector<std::int64_t>(stream)[0]) / static_cast<double>(batch);
}

}  // namespace ddp::ops
