// The MLP family's ops on the CPU (runtime/ops/layers.h and SiLU): forward against a double-precision
// reference, gradients against central finite differences (tests/ops/gradcheck.h), and what each does with bad
// input. The comparison with PyTorch itself is tests/models:layers_torch_test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/kernels/kernels.h"
#include "runtime/ops/ops.h"
#include "tests/ops/gradcheck.h"

namespace ddp {
namespace {

using namespace ddp::test;  // NOLINT(build/namespaces): the gradient-check helpers

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(S()); }

TEST(Silu, ValuesAndGradientAsTorch) {
  Tensor x = leaf({3, 7}, 41, -4.0f, 4.0f);
  Tensor t = target_like({3, 7});
  gradcheck([&] { return ops::mse_loss(ops::silu(x, S()), t, S()); }, {x}, "silu");
  autograd::NoGradGuard g;
  const std::vector<float> y = values(ops::silu(x, S()));
  const float* xp = x.data<float>();
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double v = xp[i];
    EXPECT_NEAR(y[i], v / (1.0 + std::exp(-v)), 1e-6) << "x = " << v;
  }
}

TEST(Silu, IsNeverFusedIntoALinear) {
  EXPECT_FALSE(fused_activation(Activation::kSilu));
  Tensor x = leaf({2, 3}, 42), w = leaf({4, 3}, 43);
  EXPECT_THROW(ops::linear(x, w, Tensor(), Activation::kSilu, S()), InvalidArgument);
}

// y = (x − mean)/√(var + eps)·w + b per row, in double.
std::vector<double> layer_norm_reference(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const std::int64_t cols = x.size(x.dim() - 1), rows = x.numel() / cols;
  const float *xp = x.data<float>(), *wp = w.data<float>(), *bp = b.data<float>();
  std::vector<double> y(static_cast<std::size_t>(x.numel()));
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < cols; ++c) mean += xp[r * cols + c];
    mean /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) var += (xp[r * cols + c] - mean) * (xp[r * cols + c] - mean);
    var /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = (xp[r * cols + c] - mean) / std::sqrt(var + eps) * wp[c] + bp[c];
  }
  return y;
}

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  for (const Shape& shape : {Shape{4, 9}, Shape{1, 1}, Shape{2, 3, 5}, Shape{3, 300}}) {
    Tensor x = leaf(shape, 1, -3.0f, 5.0f);
    const std::int64_t cols = shape.back();
    Tensor w = leaf({cols}, 2), b = leaf({cols}, 3);
    autograd::NoGradGuard g;
    const std::vector<float> y = values(ops::layer_norm(x, w, b, 1e-5, S()));
    const std::vector<double> ref = layer_norm_reference(x, w, b, 1e-5);
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-5) << shape_str(shape) << " " << i;
  }
}

TEST(LayerNorm, GradientsByFiniteDifferences) {
  for (const Shape& shape : {Shape{4, 6}, Shape{2, 1}, Shape{1, 5}}) {
    Tensor x = leaf(shape, 4, -2.0f, 2.0f), w = leaf({shape.back()}, 5), b = leaf({shape.back()}, 6);
    Tensor t = target_like(shape);
    // A non-uniform upstream gradient (mse against a target, then times a fixed scale) so that Σ dy ≠ 0 per row.
    gradcheck([&] { return ops::mse_loss(ops::layer_norm(x, w, b, 1e-5, S()), t, S()); }, {x, w, b},
              "layer_norm " + shape_str(shape), 1e-3);
  }
}

TEST(LayerNorm, WithoutAffineAndSecondBackwardAccumulates) {
  Tensor x = leaf({3, 4}, 7);
  Tensor t = target_like({3, 4});
  gradcheck([&] { return ops::mse_loss(ops::layer_norm(x, Tensor(), Tensor(), 1e-5, S()), t, S()); }, {x},
            "layer_norm without affine", 1e-3);
  Tensor w = leaf({4}, 8), b = leaf({4}, 9);
  auto f = [&] { return ops::mse_loss(ops::layer_norm(x, w, b, 1e-5, S()), t, S()); };
  autograd::zero_grad({x, w, b});
  autograd::backward(f(), S());
  std::vector<std::vector<float>> first;
  for (Tensor* p : {&x, &w, &b}) first.push_back(values(p->grad()));
  autograd::backward(f(), S());
  int k = 0;
  for (Tensor* p : {&x, &w, &b}) {
    const std::vector<float> second = values(p->grad());
    for (std::size_t i = 0; i < second.size(); ++i) EXPECT_FLOAT_EQ(second[i], 2 * first[k][i]) << k << " " << i;
    ++k;
  }
}

TEST(LayerNorm, RefusesAWrongWidth) {
  Tensor x = leaf({2, 5}, 10), w = leaf({4}, 11), b = leaf({4}, 12);
  try {
    ops::layer_norm(x, w, b, 1e-5, S());
    FAIL() << "a weight of the wrong width was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("must be [5]"), std::string::npos) << e.what();
  }
}

// The column order of ops::frequency_encoding, in double from the same float arguments.
TEST(FrequencyEncoding, ColumnsAreInputThenSinCosPerFrequency) {
  for (bool include : {true, false}) {
    const std::int64_t rows = 3, in = 2, L = 4;
    Tensor x = leaf({rows, in}, 13);
    autograd::NoGradGuard g;
    const Tensor y = ops::frequency_encoding(x, L, include, S());
    const std::int64_t out = in * ((include ? 1 : 0) + 2 * L);
    ASSERT_EQ(y.shape(), (Shape{rows, out}));
    const std::vector<float> yv = values(y);
    const float* xp = x.data<float>();
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t col = 0;
      if (include) {
        for (std::int64_t c = 0; c < in; ++c) EXPECT_EQ(yv[r * out + col++], xp[r * in + c]);
      }
      for (std::int64_t k = 0; k < L; ++k) {
        const auto a = static_cast<float>(std::ldexp(M_PI, static_cast<int>(k)));
        for (std::int64_t c = 0; c < in; ++c) {
          EXPECT_NEAR(yv[r * out + col++], std::sin(static_cast<double>(a * xp[r * in + c])), 1e-6);
        }
        for (std::int64_t c = 0; c < in; ++c) {
          EXPECT_NEAR(yv[r * out + col++], std::cos(static_cast<double>(a * xp[r * in + c])), 1e-6);
        }
      }
    }
  }
}

TEST(FrequencyEncoding, GradientByFiniteDifferences) {
  for (bool include : {true, false}) {
    Tensor x = leaf({3, 2}, 14);
    Tensor t = target_like({3, 2 * ((include ? 1 : 0) + 6)});
    gradcheck([&] { return ops::mse_loss(ops::frequency_encoding(x, 3, include, S()), t, S()); }, {x},
              include ? "frequency_encoding with input" : "frequency_encoding", 1e-3);
  }
}

TEST(FrequencyEncoding, RefusesNoColumns) {
  Tensor x = leaf({3, 2}, 15);
  EXPECT_THROW(ops::frequency_encoding(x, 0, false, S()), InvalidArgument);
  EXPECT_THROW(ops::frequency_encoding(x, -1, true, S()), InvalidArgument);
}

TEST(Dropout, MaskIsZeroOrTheScaleAndKeepsAboutOneMinusP) {
  const std::int64_t n = 100000;
  Tensor x = Tensor::full({n}, 2.0, DType::kFloat32, Device::cpu(), S());
  Tensor draw = Tensor::zeros({1}, DType::kInt64, Device::cpu(), S());
  for (double p : {0.1, 0.5, 0.9}) {
    const std::vector<float> y = values(ops::dropout(x, p, 7, draw, S()));
    const auto scaled = static_cast<float>(2.0f * static_cast<float>(1.0 / (1.0 - p)));
    std::int64_t kept = 0;
    for (float v : y) {
      ASSERT_TRUE(v == 0.0f || v == scaled) << v;
      kept += v != 0.0f;
    }
    // Binomial: 5 standard deviations of the kept fraction.
    EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 5 * std::sqrt(p * (1 - p) / n)) << "p = " << p;
  }
  EXPECT_EQ(draw.to_vector<std::int64_t>(S())[0], 3) << "each call advances the draw counter by one";
}

TEST(Dropout, TheMaskIsAFunctionOfSeedDrawAndElement) {
  Tensor x = leaf({50, 8}, 16);
  Tensor draw = Tensor::zeros({1}, DType::kInt64, Device::cpu(), S());
  auto mask_at = [&](std::uint64_t seed, std::int64_t d) {
    autograd::NoGradGuard g;
    draw.fill_(static_cast<double>(d), S());
    return values(ops::dropout(x, 0.5, seed, draw, S()));
  };
  EXPECT_EQ(mask_at(3, 5), mask_at(3, 5));
  EXPECT_NE(mask_at(3, 5), mask_at(3, 6));
  EXPECT_NE(mask_at(3, 5), mask_at(4, 5));
  EXPECT_NE(mask_at(3, std::int64_t{1} << 33), mask_at(3, 0)) << "the draw's high bits count too";
}

TEST(Dropout, GradientIsTheMaskAndPZeroIsTheIdentity) {
  Tensor x = leaf({4, 5}, 17);
  Tensor t = target_like({4, 5});
  Tensor draw = Tensor::zeros({1}, DType::kInt64, Device::cpu(), S());
  // The same draw for every evaluation, so the finite differences see one mask.
  gradcheck(
      [&] {
        draw.fill_(11.0, S());
        return ops::mse_loss(ops::dropout(x, 0.3, 1, draw, S()), t, S());
      },
      {x}, "dropout");
  draw.fill_(20.0, S());
  EXPECT_TRUE(ops::dropout(x, 0.0, 1, draw, S()).same(x));
  EXPECT_EQ(draw.to_vector<std::int64_t>(S())[0], 20) << "p == 0 draws nothing";
  EXPECT_THROW(ops::dropout(x, 1.0, 1, draw, S()), InvalidArgument);
  EXPECT_THROW(ops::dropout(x, 0.5, 1, Tensor::zeros({1}, DType::kInt32, Device::cpu(), S()), S()),
               InvalidArgument);
}

TEST(Embedding, RowsAndScatterAddedGradient) {
  Tensor w = leaf({5, 3}, 18);
  const std::vector<std::int32_t> ids{4, 0, 4, 2, 4};
  Tensor idx = Tensor::from_int32(ids, {5}, Device::cpu(), S());
  {
    autograd::NoGradGuard g;
    const std::vector<float> y = values(ops::embedding(w, idx, S()));
    const std::vector<float> wv = values(w);
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::size_t c = 0; c < 3; ++c) EXPECT_EQ(y[i * 3 + c], wv[ids[i] * 3 + c]);
  }
  Tensor t = target_like({5, 3});
  gradcheck([&] { return ops::mse_loss(ops::embedding(w, idx, S()), t, S()); }, {w}, "embedding");
  // Rows no index names get a zero gradient.
  const std::vector<float> gw = values(w.grad());
  for (std::size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(gw[1 * 3 + c], 0.0f);
    EXPECT_EQ(gw[3 * 3 + c], 0.0f);
  }
}

TEST(Embedding, AnIndexOutOfRangeIsRefusedOnTheCpuAndReadsNothingInTheKernel) {
  Tensor w = leaf({5, 3}, 19);
  try {
    ops::embedding(w, Tensor::from_int32({1, 5}, {2}, Device::cpu(), S()), S());
    FAIL() << "index 5 of a table of 5 rows was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("index 5 at position 1 is outside [0, 5)"), std::string::npos) << e.what();
  }
  // What the GPU does inside a graph, where nothing can be thrown: a row of zeros and no gradient.
  const std::vector<std::int32_t> ids{-1, 2, 5};
  std::vector<float> y(9, 7.0f);
  kernels::cpu::embedding_forward(w.data<float>(), 5, 3, ids.data(), 3, y.data(), nullptr);
  const std::vector<float> wv = values(w);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 3), std::vector<float>(3, 0.0f));
  EXPECT_EQ(std::vector<float>(y.begin() + 3, y.begin() + 6), std::vector<float>(wv.begin() + 6, wv.begin() + 9));
  EXPECT_EQ(std::vector<float>(y.begin() + 6, y.end()), std::vector<float>(3, 0.0f));
  std::vector<float> dw(15, 1.0f);
  const std::vector<float> dy(9, 0.5f);
  kernels::cpu::embedding_backward(dy.data(), ids.data(), 3, 5, 3, dw.data(), false, nullptr);
  for (std::size_t i = 0; i < 15; ++i) EXPECT_EQ(dw[i], i / 3 == 2 ? 0.5f : 0.0f) << i;
}

TEST(CategoryIds, ExactIntegersInRangeAndAClearErrorOtherwise) {
  Tensor x = Tensor::from_vector({2, 0.5f, 0, 1.5f, 3, -2}, {3, 2}, Device::cpu(), S());
  EXPECT_EQ(ops::category_ids(x, 0, 4, S()).to_vector<std::int32_t>(S()), (std::vector<std::int32_t>{2, 0, 3}));
  for (const auto& [column, cardinality, what] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::string>>{
           {0, 3, "row 2, column 0 holds 3.000000"}, {1, 4, "row 0, column 1 holds 0.500000"}}) {
    try {
      ops::category_ids(x, column, cardinality, S());
      FAIL() << "column " << column << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  // The kernel itself, as a GPU runs it: −1 for a fraction, a negative value, a NaN or one past the range.
  const std::vector<float> bad{0.5f, -1.0f, NAN, 4.0f, 3.0f};
  std::vector<std::int32_t> ids(5);
  kernels::cpu::float_column_to_index(bad.data(), 5, 1, 0, 4, ids.data(), nullptr);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{-1, -1, -1, -1, 3}));
}

TEST(Columns, SliceAndConcatValuesAndGradients) {
  Tensor a = leaf({3, 2}, 20), b = leaf({3, 4}, 21);
  {
    autograd::NoGradGuard g;
    const std::vector<float> y = values(ops::concat_columns({a, ops::slice_columns(b, 1, 3, S())}, S()));
    const std::vector<float> av = values(a), bv = values(b);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(std::vector<float>(y.begin() + r * 4, y.begin() + r * 4 + 2),
                std::vector<float>(av.begin() + r * 2, av.begin() + r * 2 + 2));
      EXPECT_EQ(std::vector<float>(y.begin() + r * 4 + 2, y.begin() + r * 4 + 4),
                std::vector<float>(bv.begin() + r * 4 + 1, bv.begin() + r * 4 + 3));
    }
  }
  Tensor t = target_like({3, 6});
  auto f = [&] {
    const Tensor y = ops::concat_columns({ops::slice_columns(b, 1, 4, S()), a, ops::slice_columns(b, 0, 1, S())}, S());
    return ops::mse_loss(y, t, S());
  };
  gradcheck(f, {a, b}, "slice and concat");
  EXPECT_THROW(ops::slice_columns(b, 3, 5, S()), InvalidArgument);
  EXPECT_THROW(ops::concat_columns({a, leaf({2, 2}, 22)}, S()), InvalidArgument);
}

}  // namespace
}  // namespace ddp
