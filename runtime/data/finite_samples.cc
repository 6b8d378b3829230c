// finite_samples: the kernels' find_nonfinite over each array, read back, then the finite rows gathered where
// some are dropped (the common case, every sample finite, copies nothing).
#include "runtime/data/finite_samples.h"

#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/kernels/dispatch.h"

namespace ddp::data {
namespace {

// For each row of x then each row of y, kernels' find_nonfinite: the first column that is not finite, or the
// width. On a GPU both arrays are checked into one buffer and read back with one wait.
std::vector<std::int64_t> first_nonfinite_columns(const Tensor& x, const Tensor& y, const Stream& stream) {
  const std::int64_t rows = x.size(0);
  if (x.device().is_cpu()) {
    std::vector<std::int64_t> first(static_cast<std::size_t>(2 * rows));
    kernels::cpu::find_nonfinite(x.data<float>(), rows, x.size(1), first.data(), nullptr);
    kernels::cpu::find_nonfinite(y.data<float>(), rows, y.size(1), first.data() + rows, nullptr);
    return first;
  }
  const Tensor first = Tensor::empty({2 * rows}, DType::kInt64, x.device(), stream);
  DDP_DISPATCH(x.device(), find_nonfinite, x.data<float>(), rows, x.size(1), first.data<std::int64_t>(),
               stream.handle());
  DDP_DISPATCH(x.device(), find_nonfinite, y.data<float>(), rows, y.size(1), first.data<std::int64_t>() + rows,
               stream.handle());
  return first.to_vector<std::int64_t>(stream);
}

std::string where(const char* array, std::int64_t row, std::int64_t column) {
  return std::string(array) + " row " + std::to_string(row) + ", column " + std::to_string(column) +
         " (counting from 0; in Fortran " + array + "(" + std::to_string(column + 1) + ", " + std::to_string(row + 1) +
         "))";
}

}  // namespace

InvalidArgument nonfinite_sample_error(std::int64_t row, std::int64_t column, std::int64_t a) {
  const std::string value = column < a ? where("x", row, column) : where("y", row, column - a);
  return InvalidArgument("a sample is not finite: " + value +
                         " is NaN or infinite: pass finite samples, or set the non-finite policy to skip such "
                         "samples (they are then counted)");
}

FiniteSamples finite_samples(const Tensor& x, const Tensor& y, NonFinitePolicy policy, const Stream& stream) {
  const auto fits = [&](const Tensor& t) {
    return t.defined() && t.dtype() == DType::kFloat32 && t.dim() == 2 && t.device() == x.device();
  };
  DDP_CHECK(fits(x) && fits(y) && x.size(0) == y.size(0),
            "finite_samples: x and y must be float32 [n, a] and [n, b] on one device, got " +
                (x.defined() ? x.describe() : "undefined") + " and " + (y.defined() ? y.describe() : "undefined"));
  const std::int64_t rows = x.size(0), a = x.size(1), b = y.size(1);
  const std::vector<std::int64_t> first = first_nonfinite_columns(x, y, stream);
  const std::int64_t* bad_x = first.data();
  const std::int64_t* bad_y = first.data() + rows;
  std::vector<std::int64_t> keep;
  keep.reserve(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const bool finite = bad_x[r] == a && bad_y[r] == b;
    if (finite) {
      keep.push_back(r);
    } else if (policy == NonFinitePolicy::kRefuse) {
      throw nonfinite_sample_error(r, bad_x[r] < a ? bad_x[r] : a + bad_y[r], a);
    }
  }
  FiniteSamples out;
  out.skipped = rows - static_cast<std::int64_t>(keep.size());
  if (out.skipped == 0) {
    out.x = x;
    out.y = y;
    return out;
  }
  const std::int64_t n = static_cast<std::int64_t>(keep.size());
  out.x = Tensor::empty({n, a}, DType::kFloat32, x.device(), stream);
  out.y = Tensor::empty({n, b}, DType::kFloat32, x.device(), stream);
  if (n == 0) return out;
  if (x.device().is_cpu()) {
    kernels::cpu::gather_batch(x.data_ptr(), a * 4, y.data_ptr(), b * 4, keep.data(), nullptr, n, out.x.data_ptr(),
                               out.y.data_ptr(), nullptr);
    return out;
  }
  // The row numbers through pinned staging, freed on `stream` once the gather has read them.
  const Tensor rows_kept = Tensor::from_host(keep.data(), {n}, DType::kInt64, x.device(), stream);
  DDP_DISPATCH(x.device(), gather_batch, x.data_ptr(), a * 4, y.data_ptr(), b * 4, rows_kept.data<std::int64_t>(),
               nullptr, n, out.x.data_ptr(), out.y.data_ptr(), stream.handle());
  return out;
}

}  // namespace ddp::data
