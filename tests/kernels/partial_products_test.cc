// How many partial products the GPU Linear computes a GEMM in (GemmOptions::parts) is shape arithmetic on the
// host, so it is checked here, without a GPU, for the rule and for fixed requests, in the three places that use
// it: the pair forward (the hidden layer before a narrow head), an input gradient taken through an activation,
// and, with plain_layer_parts, a wide layer's own forward. The GPU tests check the arithmetic of each path.
#include <gtest/gtest.h>

#include "runtime/kernels/cuda/gemm_options.h"
#include "runtime/kernels/kernels.h"

namespace ddp::kernels::cuda {
namespace {

// Sets the GEMM options for one test and restores them after.
class OptionsScope {
 public:
  explicit OptionsScope(int parts, bool plain_layer_parts = true) : saved_(gemm_options()) {
    GemmOptions o = saved_;
    o.parts = parts;
    o.plain_layer_parts = plain_layer_parts;
    set_gemm_options(o);
  }
  ~OptionsScope() { set_gemm_options(saved_); }

 private:
  GemmOptions saved_;
};

constexpr DType kF32 = DType::kFloat32;
constexpr DType kBF16 = DType::kBFloat16;

// By default the rule decides, in all three uses: the main job's step takes partial products, the big model's none.
TEST(PartialProducts, TheRuleByDefault) {
  const GemmOptions defaults;
  EXPECT_EQ(defaults.parts, -1);
  EXPECT_TRUE(defaults.plain_layer_parts);
  OptionsScope scope(defaults.parts, defaults.plain_layer_parts);
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 8);
  EXPECT_EQ(input_gradient_parts(kF32, {128, 512, 512}), 8);
  EXPECT_EQ(linear_forward_parts(kF32, {128, 784, 512}), 4);
  EXPECT_EQ(linear_pair_parts(kF32, {256, 1024, 1024}, 10), 1);
  EXPECT_EQ(linear_forward_parts(kF32, {256, 784, 1024}), 1);
}

TEST(PartialProducts, NoneWhenTurnedOff) {
  OptionsScope scope(0);
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 1);
  EXPECT_EQ(input_gradient_parts(kF32, {128, 512, 512}), 1);
  EXPECT_EQ(linear_forward_parts(kF32, {128, 784, 512}), 1);
}

// The rule: the most slices (at most 8, at least 4) that keep 64 x 64 tiles times slices within 128, each slice
// at least 64 deep and a whole number of 16-byte vectors.
TEST(PartialProducts, RuleFillsAboutOneWave) {
  OptionsScope scope(-1);
  // The pair: the main job (16 tiles: 8 slices of 64), partial rows (2 tiles, but slices of 256 / 8 are too
  // shallow: 4), the big model (64 tiles: already half a wave, so none).
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 8);
  EXPECT_EQ(linear_pair_parts(kF32, {37, 256, 96}, 32), 4);
  EXPECT_EQ(linear_pair_parts(kF32, {256, 1024, 1024}, 10), 1);
  // The input gradient of the main job's second hidden layer (K = its 512 outputs); a layer whose 264 outputs
  // are a multiple of 8 but not of 16 (4 slices would not be 16-byte vectors, and 2 are too few); slices of
  // 128 / 4 too shallow.
  EXPECT_EQ(input_gradient_parts(kF32, {128, 512, 512}), 8);
  EXPECT_EQ(input_gradient_parts(kF32, {1000, 40, 264}), 1);
  EXPECT_EQ(input_gradient_parts(kF32, {64, 96, 128}), 1);
  // The main job's first hidden layer: 784 = 16 x 49, so 4 slices; the big model's: 64 tiles, none.
  EXPECT_EQ(linear_forward_parts(kF32, {128, 784, 512}), 4);
  EXPECT_EQ(linear_forward_parts(kF32, {256, 784, 1024}), 1);
  // Already a wave of tiles: none.
  EXPECT_EQ(linear_forward_parts(kF32, {1024, 784, 1024}), 1);
}

TEST(PartialProducts, FixedRequestsWhereTheSlicesFit) {
  for (int request : {2, 4, 8}) {
    OptionsScope scope(request);
    EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), request);
    EXPECT_EQ(input_gradient_parts(kF32, {128, 512, 512}), request);
    // 784 is a multiple of 8 and 16 but not of 32: 8 slices of it would not be whole 16-byte vectors.
    EXPECT_EQ(linear_forward_parts(kF32, {128, 784, 512}), request == 8 ? 1 : request);
  }
  OptionsScope one(1);
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 1);
  OptionsScope too_many(16);
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 1);
}

TEST(PartialProducts, NoneWhereNoKernelOfOursCanAddThem) {
  OptionsScope scope(-1);
  EXPECT_EQ(linear_pair_parts(kBF16, {128, 512, 512}, 10), 1) << "float32 only";
  EXPECT_EQ(input_gradient_parts(LinearTypes(kBF16, kF32, kF32), {128, 512, 512}), 1) << "float32 only";
  EXPECT_EQ(linear_forward_parts(kBF16, {128, 784, 512}), 1) << "float32 only";
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 33), 1) << "a head wider than the narrow kernel";
  EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 32}, 10), 1) << "a narrow first layer has no split to remove";
  EXPECT_EQ(input_gradient_parts(kF32, {128, 512, 10}), 1) << "the narrow backward computes dx itself";
  EXPECT_EQ(input_gradient_parts(kF32, {37, 129, 67}), 1) << "rows of 129 floats: no 8-float vectors";
  EXPECT_EQ(linear_forward_parts(kF32, {37, 129, 67}), 1) << "rows of 67 floats: no 8-float vectors";
  EXPECT_EQ(input_gradient_parts(kF32, {0, 512, 512}), 1) << "no rows";
  {
    OptionsScope plain_off(-1, false);
    EXPECT_EQ(linear_forward_parts(kF32, {128, 784, 512}), 1) << "plain layers need their own switch";
  }
  {
    GemmOptions o = gemm_options();
    o.narrow_layers = false;
    set_gemm_options(o);
    EXPECT_EQ(linear_pair_parts(kF32, {128, 512, 512}, 10), 1) << "no narrow kernel to add the parts";
  }
}

// The parts live in half of the stream's GEMM workspace: a larger result takes one GEMM.
TEST(PartialProducts, BoundedByTheWorkspace) {
  OptionsScope scope(8);
  EXPECT_EQ(input_gradient_parts(kF32, {512, 1024, 1024}), 8);   // 16 MiB: fits
  EXPECT_EQ(input_gradient_parts(kF32, {1024, 1024, 1024}), 1);  // 32 MiB: does not
  EXPECT_EQ(linear_forward_parts(kF32, {4096, 1024, 1024}), 1);
}

}  // namespace
}  // namespace ddp::kernels::cuda
