// FusedMlpMse on the CPU against the autograd path (forward, ops::mse_loss, backward) on the same model: the loss
// and every gradient to float rounding, for ReLU, tanh and no activation, batches of whole and partial blocks;
// and the models it refuses, each with its reason. tests/gpu/tensor_ops_gpu_test.cc runs the CUDA kernel against
// the same reference, eagerly and replayed from a CUDA graph.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/models/fused_mlp_mse.h"
#include "runtime/ops/ops.h"
#include "runtime/optim/optimizer.h"

namespace ddp {
namespace {

std::vector<float> gradients(const Module& model) {
  std::vector<float> all;
  for (const auto& [name, t] : model.state_dict()) {
    const std::vector<float> g = t.grad().to_vector<float>(cpu_stream());
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6 + 1e-4 * std::fabs(want[i])) << what << " element " << i;
  }
}

TEST(FusedMlpMse, GivesTheAutogradPathsLossAndGradients) {
  for (Activation act : {Activation::kTanh, Activation::kRelu, Activation::kNone}) {
    for (const std::vector<std::int64_t>& sizes : {std::vector<std::int64_t>{5, 64, 64, 1},
                                                   std::vector<std::int64_t>{3, 17, 2}}) {
      for (std::int64_t rows : {37, 256}) {
        const std::string what = std::string(activation_name(act)) + " " + std::to_string(sizes[1]) + " wide, " +
                                 std::to_string(rows) + " rows";
        MLP reference(sizes, act, 7), fused_model(sizes, act, 7);
        AdamW reference_opt(reference, {}), fused_opt(fused_model, {});
        const Tensor x = Tensor::uniform({rows, sizes.front()}, -1.0f, 1.0f, 11, 0, Device::cpu(), cpu_stream());
        const Tensor y = Tensor::uniform({rows, sizes.back()}, -1.0f, 1.0f, 12, 0, Device::cpu(), cpu_stream());

        reference_opt.zero_grad(cpu_stream());
        const Tensor want = ops::mse_loss(reference.forward(x, cpu_stream()), y, cpu_stream());
        autograd::backward(want, cpu_stream());
        FusedMlpMse fused(fused_model);
        fused_opt.zero_grad(cpu_stream());
        const Tensor got = fused(x, y, cpu_stream());

        expect_close(got.to_vector<float>(cpu_stream()), want.to_vector<float>(cpu_stream()), what + " loss");
        expect_close(gradients(fused_model), gradients(reference), what + " gradients");
      }
    }
  }
}

TEST(FusedMlpMse, RefusesWhatItDoesNotComputeSayingWhy) {
  MLP gelu({4, 8, 1}, Activation::kGelu, 1), wide({4, 65, 1}, Activation::kTanh, 1), fresh({4, 8, 1}, Activation::kTanh, 1);
  AdamW a(gelu, {}), b(wide, {});
  EXPECT_NE(FusedMlpMse::unfit_reason(gelu).find("activation is gelu"), std::string::npos);
  EXPECT_NE(FusedMlpMse::unfit_reason(wide).find("at most 64 wide"), std::string::npos);
  EXPECT_NE(FusedMlpMse::unfit_reason(fresh).find("no gradients yet"), std::string::npos);
  try {
    FusedMlpMse refused(gelu);
    FAIL() << "a GELU model was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot take the fused pass"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp
