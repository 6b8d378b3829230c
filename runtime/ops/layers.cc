// The MLP-family layers' ops: kernels of runtime/kernels (layers.cc / layers.cu) through the dispatch, backwards
// written through autograd::grad_target (overwrite on the first write of a backward, then accumulate).
#include "runtime/ops/layers.h"

#include <cmath>
#include <string>

#include "runtime/autograd/autograd.h"
#include "runtime/kernels/dispatch.h"
#include "runtime/ops/op_checks.h"

namespace ddp::ops {
namespace {

void check_matrix(const char* op, const char* what, const Tensor& t) {
  DDP_CHECK(t.dim() == 2, std::string(op) + ": " + what + " must be a matrix [rows, columns], got " + t.describe());
}

// The pointer of a gradient to write, or null when the tensor wants none; `accumulate` receives the flag.
float* grad_pointer(const Tensor& t, const Stream& s, bool* accumulate, Tensor* keep) {
  *accumulate = false;
  if (!t.defined()) return nullptr;
  autograd::GradTarget target = autograd::grad_target(t, s);
  if (!target.grad.defined()) return nullptr;
  *accumulate = target.accumulate;
  *keep = target.grad;
  return target.grad.data<float>();
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Stream& stream) {
  constexpr const char* kOp = "layer_norm";
  detail::check_float_input(kOp, "x", x, stream);
  DDP_CHECK(x.dim() >= 1 && x.numel() > 0, std::string(kOp) + ": x must have elements, got " + x.describe());
  DDP_CHECK(weight.defined() == bias.defined(),
            std::string(kOp) + ": weight and bias are both given or both undefined (no affine transform)");
  DDP_CHECK(eps > 0.0, std::string(kOp) + ": eps must be positive, got " + std::to_string(eps));
  const std::int64_t cols = x.size(x.dim() - 1);
  const std::int64_t rows = x.numel() / cols;
  if (weight.defined()) {
    detail::check_float_input(kOp, "weight", weight, stream);
    detail::check_float_input(kOp, "bias", bias, stream);
    detail::check_same_device(kOp, x, "x", weight, "weight");
    detail::check_same_device(kOp, x, "x", bias, "bias");
    DDP_CHECK(weight.shape() == Shape{cols} && bias.shape() == Shape{cols},
              std::string(kOp) + ": weight and bias must be [" + std::to_string(cols) + "] (x's last dimension), got " +
                  weight.describe() + " and " + bias.describe());
  }
  const Device device = x.device();
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32, device, stream);
  Tensor mean = Tensor::empty({rows}, DType::kFloat32, device, stream);
  Tensor rstd = Tensor::empty({rows}, DType::kFloat32, device, stream);
  const float* w = weight.defined() ? weight.data<float>() : nullptr;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  DDP_DISPATCH(device, layer_norm_forward, x.data<float>(), w, b, rows, cols, static_cast<float>(eps),
               y.data<float>(), mean.data<float>(), rstd.data<float>(), stream.handle());
  if (autograd::should_record({&x, &weight, &bias})) {
    std::vector<Tensor> inputs{x};
    if (weight.defined()) inputs.insert(inputs.end(), {weight, bias});
    autograd::record(kOp, inputs, {y}, [x, weight, bias, y, mean, rstd, rows, cols, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      bool acc_x = false, acc_w = false, acc_b = false;
      Tensor gx, gw, gb;
      float* dx = grad_pointer(x, s, &acc_x, &gx);
      float* dw = grad_pointer(weight, s, &acc_w, &gw);
      float* db = grad_pointer(bias, s, &acc_b, &gb);
      const float* w = weight.defined() ? weight.data<float>() : nullptr;
      DDP_DISPATCH(device, layer_norm_backward, dy.data<float>(), x.data<float>(), w, mean.data<float>(),
                   rstd.data<float>(), rows, cols, dx, acc_x, dw, acc_w, db, acc_b, s.handle());
    });
  }
  return y;
}

Tensor frequency_encoding(const Tensor& x, std::int64_t frequencies, bool include_input, const Stream& stream) {
  constexpr const char* kOp = "frequency_encoding";
  detail::check_float_input(kOp, "x", x, stream);
  check_matrix(kOp, "x", x);
  DDP_CHECK(frequencies >= 0 && frequencies <= 64,
            std::string(kOp) + ": the number of frequencies must be in [0, 64], got " + std::to_string(frequencies));
  DDP_CHECK(include_input || frequencies > 0,
            std::string(kOp) + ": no frequencies and no input would give no columns; include the input or add one");
  const std::int64_t rows = x.size(0), in = x.size(1);
  const std::int64_t out = in * ((include_input ? 1 : 0) + 2 * frequencies);
  const Device device = x.device();
  Tensor y = Tensor::empty({rows, out}, DType::kFloat32, device, stream);
  DDP_DISPATCH(device, frequency_encoding_forward, x.data<float>(), rows, in, frequencies, include_input,
               y.data<float>(), stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record(kOp, {x}, {y}, [x, y, rows, in, frequencies, include_input, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      autograd::GradTarget gx = autograd::grad_target(x, s);
      if (!gx.grad.defined()) return;
      DDP_DISPATCH(device, frequency_encoding_backward, x.data<float>(), dy.data<float>(), rows, in, frequencies,
                   include_input, gx.grad.data<float>(), gx.accumulate, s.handle());
    });
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, std::uint64_t seed, const Tensor& draw, const Stream& stream) {
  constexpr const char* kOp = "dropout";
  detail::check_float_input(kOp, "x", x, stream);
  DDP_CHECK(p >= 0.0 && p < 1.0, std::string(kOp) + ": p must be in [0, 1), got " + std::to_string(p));
  if (p == 0.0) return x;
  detail::check_defined(kOp, "draw", draw);
  detail::check_dtype(kOp, "draw", draw, DType::kInt64);
  detail::check_same_device(kOp, x, "x", draw, "draw");
  DDP_CHECK(draw.numel() == 1, std::string(kOp) + ": draw must be one int64 counter, got " + draw.describe());
  const Device device = x.device();
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32, device, stream);
  Tensor mask = Tensor::empty(x.shape(), DType::kFloat32, device, stream);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  DDP_DISPATCH(device, dropout_forward, x.data<float>(), x.numel(), static_cast<float>(p), scale, seed,
               draw.data<std::int64_t>(), y.data<float>(), mask.data<float>(), stream.handle());
  DDP_DISPATCH(device, advance_counter, draw.data<std::int64_t>(), 1, stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record(kOp, {x}, {y}, [x, y, mask, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      autograd::GradTarget gx = autograd::grad_target(x, s);
      if (!gx.grad.defined()) return;
      DDP_DISPATCH(device, mul, dy.data<float>(), mask.data<float>(), gx.grad.data<float>(), dy.numel(),
                   gx.accumulate, s.handle());
    });
  }
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, const Stream& stream) {
  constexpr const char* kOp = "embedding";
  detail::check_float_input(kOp, "weight", weight, stream);
  check_matrix(kOp, "weight", weight);
  detail::check_defined(kOp, "indices", indices);
  detail::check_dtype(kOp, "indices", indices, DType::kInt32);
  detail::check_same_device(kOp, weight, "weight", indices, "indices");
  DDP_CHECK(indices.dim() == 1, std::string(kOp) + ": indices must be a vector [n], got " + indices.describe());
  const std::int64_t num = weight.size(0), dim = weight.size(1), n = indices.numel();
  if (indices.device().is_cpu()) {
    const std::int32_t* ids = indices.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) {
      DDP_CHECK(ids[i] >= 0 && ids[i] < num, std::string(kOp) + ": index " + std::to_string(ids[i]) +
                                                 " at position " + std::to_string(i) + " is outside [0, " +
                                                 std::to_string(num) + ") of a table of " + std::to_string(num) +
                                                 " rows; give ids in that range or a larger table");
    }
  }
  const Device device = weight.device();
  Tensor y = Tensor::empty({n, dim}, DType::kFloat32, device, stream);
  DDP_DISPATCH(device, embedding_forward, weight.data<float>(), num, dim, indices.data<std::int32_t>(), n,
               y.data<float>(), stream.handle());
  if (autograd::should_record({&weight})) {
    autograd::record(kOp, {weight}, {y}, [weight, indices, y, num, dim, n, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      autograd::GradTarget gw = autograd::grad_target(weight, s);
      if (!gw.grad.defined()) return;
      DDP_DISPATCH(device, embedding_backward, dy.data<float>(), indices.data<std::int32_t>(), n, num, dim,
                   gw.grad.data<float>(), gw.accumulate, s.handle());
    });
  }
  return y;
}

Tensor category_ids(const Tensor& x, std::int64_t column, std::int64_t cardinality, const Stream& stream) {
  constexpr const char* kOp = "category_ids";
  detail::check_float_input(kOp, "x", x, stream);
  check_matrix(kOp, "x", x);
  DDP_CHECK(column >= 0 && column < x.size(1), std::string(kOp) + ": column " + std::to_string(column) +
                                                   " is outside x " + x.describe());
  DDP_CHECK(cardinality > 0 && cardinality <= 0x7fffffff,
            std::string(kOp) + ": the cardinality must be in [1, 2^31 - 1], got " + std::to_string(cardinality));
  const std::int64_t rows = x.size(0);
  Tensor ids = Tensor::empty({rows}, DType::kInt32, x.device(), stream);
  DDP_DISPATCH(x.device(), float_column_to_index, x.data<float>(), rows, x.size(1), column, cardinality,
               ids.data<std::int32_t>(), stream.handle());
  if (x.device().is_cpu()) {
    const std::int32_t* id = ids.data<std::int32_t>();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (id[r] >= 0) continue;
      const float v = x.data<float>()[r * x.size(1) + column];
      throw InvalidArgument(std::string(kOp) + ": row " + std::to_string(r) + ", column " + std::to_string(column) +
                            " holds " + std::to_string(v) + ", not a category id (an integer in [0, " +
                            std::to_string(cardinality) + ")); encode the categories as 0, 1, ... in that column");
    }
  }
  return ids;
}

Tensor slice_columns(const Tensor& x, std::int64_t begin, std::int64_t end, const Stream& stream) {
  constexpr const char* kOp = "slice_columns";
  detail::check_float_input(kOp, "x", x, stream);
  check_matrix(kOp, "x", x);
  const std::int64_t rows = x.size(0), cols = x.size(1);
  DDP_CHECK(begin >= 0 && begin <= end && end <= cols, std::string(kOp) + ": columns [" + std::to_string(begin) +
                                                           ", " + std::to_string(end) + ") are not within x " +
                                                           x.describe());
  const Device device = x.device();
  Tensor y = Tensor::empty({rows, end - begin}, DType::kFloat32, device, stream);
  DDP_DISPATCH(device, copy_columns, x.data<float>() + begin, cols, y.data<float>(), end - begin, rows, end - begin,
               false, stream.handle());
  if (autograd::should_record({&x})) {
    autograd::record(kOp, {x}, {y}, [x, y, begin, end, rows, cols, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      autograd::GradTarget gx = autograd::grad_target(x, s);
      if (!gx.grad.defined()) return;
      // The columns outside the slice get no gradient: zero them when this write is the first.
      if (!gx.accumulate) gx.grad.zero_(s);
      DDP_DISPATCH(device, copy_columns, dy.data<float>(), end - begin, gx.grad.data<float>() + begin, cols, rows,
                   end - begin, true, s.handle());
    });
  }
  return y;
}

Tensor concat_columns(const std::vector<Tensor>& parts, const Stream& stream) {
  constexpr const char* kOp = "concat_columns";
  DDP_CHECK(!parts.empty(), std::string(kOp) + ": no tensors to concatenate");
  std::int64_t total = 0;
  for (const Tensor& p : parts) {
    detail::check_float_input(kOp, "a part", p, stream);
    check_matrix(kOp, "every part", p);
    detail::check_same_device(kOp, parts[0], "the first part", p, "another");
    DDP_CHECK(p.size(0) == parts[0].size(0), std::string(kOp) + ": the parts must have one number of rows, got " +
                                                 parts[0].describe() + " and " + p.describe());
    total += p.size(1);
  }
  const std::int64_t rows = parts[0].size(0);
  const Device device = parts[0].device();
  Tensor y = Tensor::empty({rows, total}, DType::kFloat32, device, stream);
  std::int64_t offset = 0;
  for (const Tensor& p : parts) {
    DDP_DISPATCH(device, copy_columns, p.data<float>(), p.size(1), y.data<float>() + offset, total, rows, p.size(1),
                 false, stream.handle());
    offset += p.size(1);
  }
  bool any = false;
  for (const Tensor& p : parts) any = any || autograd::should_record({&p});
  if (any) {
    autograd::record(kOp, parts, {y}, [parts, y, rows, total, device](const Stream& s) {
      const Tensor dy = autograd::grad_of(y, s);
      if (!dy.defined()) return;
      std::int64_t offset = 0;
      for (const Tensor& p : parts) {
        autograd::GradTarget gp = autograd::grad_target(p, s);
        if (gp.grad.defined()) {
          DDP_DISPATCH(device, copy_columns, dy.data<float>() + offset, total, gp.grad.data<float>(), p.size(1), rows,
                       p.size(1), gp.accumulate, s.handle());
        }
        offset += p.size(1);
      }
    });
  }
  return y;
}

}  // namespace ddp::ops
