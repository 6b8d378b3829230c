// TrainStep as a loop of one's own drives it, at 1 and 2 ranks (on session_tests.h's Session), on its device:
//   - its steps give bitwise the parameters of the hand-written eager loop (zero_grad, forward, backward,
//     optimizer.step), across a shorter last batch; on a GPU over NCCL the replayed graph gives them too;
//   - a step function that does not return a loss, or reads a value on the host, or steps an optimizer of its
//     own, or backpropagates with find_unused_parameters, is refused with the reason once the step is captured
//     (GPU), or where it is wrong everywhere (the loss);
//   - a non-finite loss ends the run on every rank naming the rank, or with skip_nonfinite skips the step;
//   - with refuse_nonfinite_samples, each rank stepping alone, a batch holding a NaN or an infinity is refused
//     (at the step that reads its loss, or at the next wait) naming its row and column, with no update: the
//     parameters are the bits of the loop that never saw it, eager or replayed; ranks stepping together refuse
//     the step on every rank when one rank's batch holds one, each naming that rank, row and column.
// tools/gpu_jobs.txt runs the binary on the GPU machine at 1 rank (NCCL, captured) and 2 ranks (MPI, eager).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ddp.h"
#include "runtime/models/fused_mlp_mse.h"
#include "runtime/training/train_step.h"
#include "tests/models/residual_model.h"
#include "tests/training/session_tests.h"

namespace ddp {
namespace {

using testing::gradients;
using testing::parameters;
using testing::test_session;

// Batch k of `rows` rows: 6 features and 3 float targets, the same on every rank except for a rank offset.
std::pair<Tensor, Tensor> batch(int k, int64_t rows) {
  Session& s = test_session();
  std::vector<float> x(rows * 6), y(rows * 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * (i + 13 * k + 101 * s.rank()));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.21f * (i + 7 * k));
  return {Tensor::from_vector(x, {rows, 6}, s.device(), s.stream()),
          Tensor::from_vector(y, {rows, 3}, s.device(), s.stream())};
}

// A model, its DDP and its optimizer, as a loop of one's own makes them.
struct Loop {
  MLP model{{6, 16, 16, 3}, Activation::kGelu, 5, test_session().device(), test_session().stream()};
  DistributedDataParallel ddp{model, test_session()};
  AdamW optimizer{model, {.lr = 1e-2}};
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor l = ops::mse_loss(model.forward(x), y);
    ddp.backward(l);
    return l;
  }
};

bool graphs_possible() { return test_session().device().is_cuda() && test_session().backend() == Backend::kNccl; }

TEST(TrainStep, GivesTheBitsOfTheHandWrittenEagerLoopAcrossAShorterLastBatch) {
  Loop eager, stepped;
  TrainStep step(test_session(), stepped.optimizer,
                 [&](const Tensor& x, const Tensor& y) { return stepped.loss(x, y); },
                 {.eager_steps = 2});
  for (int k = 0; k < 12; ++k) {
    const auto [x, y] = batch(k, k == 7 ? 5 : 8);  // batch 7 is shorter: eager from the same state
    eager.model.zero_grad();
    eager.loss(x, y);
    eager.optimizer.step();
    const StepResult r = step(x, y, /*read_loss=*/k % 4 == 3);
    EXPECT_TRUE(r.taken);
    EXPECT_EQ(r.replayed, graphs_possible() && k >= 2 && k != 7) << "step " << k;
    if (k % 4 == 3) {
      EXPECT_TRUE(std::isfinite(r.mean_loss));
    }
  }
  EXPECT_EQ(step.captured(), graphs_possible());
  EXPECT_EQ(parameters(stepped.model), parameters(eager.model));
}

// A residual LayerNorm GELU model with a Dropout: the captured step draws each replay's mask from the draw counter
// on the device, so the replayed run equals the eager one bit for bit (and the masks change step to step).
TEST(TrainStep, AResidualLayerNormDropoutModelStepsTheEagerBitsWhenCaptured) {
  Session& s = test_session();
  auto make = [&] {
    auto model = std::make_shared<Sequential>();
    model->add(test::residual_layer_norm_gelu_model(3, s.device(), s.stream(), 6, 32, 3));
    model->add(std::make_shared<Dropout>(0.2, 11, s.device(), s.stream()));
    return model;
  };
  const auto eager_model = make(), captured_model = make();
  DistributedDataParallel eager_ddp(*eager_model, s), captured_ddp(*captured_model, s);
  AdamW eager_opt(*eager_model, {.lr = 1e-2}), captured_opt(*captured_model, {.lr = 1e-2});
  TrainStep eager(s, eager_opt, [&](const Tensor& x, const Tensor& y) {
    Tensor l = ops::mse_loss(eager_model->forward(x), y);
    eager_ddp.backward(l);
    return l;
  }, {.cuda_graph = false});
  TrainStep captured(s, captured_opt, [&](const Tensor& x, const Tensor& y) {
    Tensor l = ops::mse_loss(captured_model->forward(x), y);
    captured_ddp.backward(l);
    return l;
  }, {.eager_steps = 2});
  for (int k = 0; k < 10; ++k) {
    const auto [x, y] = batch(k, 8);
    eager(x, y);
    captured(x, y);
  }
  EXPECT_EQ(captured.captured(), graphs_possible());
  EXPECT_EQ(parameters(*captured_model), parameters(*eager_model));
}

TEST(TrainStep, SaysWhyItRunsEagerly) {
  Loop run;
  TrainStep clipped(test_session(), run.optimizer, [&](const Tensor& x, const Tensor& y) { return run.loss(x, y); },
                    {.clip_grad_norm = 1.0});
  EXPECT_NE(clipped.eager_reason(), "");
  if (!test_session().device().is_cuda()) {
    EXPECT_EQ(clipped.eager_reason(), "the CPU has no graphs");
  }
  TrainStep off(test_session(), run.optimizer, [&](const Tensor& x, const Tensor& y) { return run.loss(x, y); },
                {.cuda_graph = false});
  EXPECT_EQ(off.eager_reason(), "TrainStepOptions::cuda_graph = false");
}

// The refusal a step function meets: the CollectiveError's text, or "(accepted)".
std::string refusal(Loop& run, const TrainStep::Function& function, TrainStepOptions options = {}) {
  TrainStep step(test_session(), run.optimizer, function, options);
  try {
    for (int k = 0; k < 5; ++k) {
      const auto [x, y] = batch(k, 8);
      step(x, y);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(TrainStep, AStepFunctionThatReturnsNoLossIsRefused) {
  Loop run;
  const std::string why = refusal(run, [&](const Tensor& x, const Tensor& y) {
    run.loss(x, y);
    return run.model.forward(x);
  });
  EXPECT_NE(why.find("the step function must return its loss, a float32 tensor of one element"), std::string::npos)
      << why;
}

TEST(TrainStep, WhatACapturedStepCannotDoIsRefusedNamingIt) {
  if (!graphs_possible()) GTEST_SKIP() << "captures need a GPU over NCCL; here the same steps run eagerly";
  {
    Loop run;
    const std::string why = refusal(run, [&](const Tensor& x, const Tensor& y) {
      Tensor l = run.loss(x, y);
      if (l.item() > 1e9) std::printf("large\n");
      return l;
    });
    EXPECT_NE(why.find("Tensor::item() reads"), std::string::npos) << why;
    EXPECT_NE(why.find("TrainStepOptions::cuda_graph = false runs the step eagerly"), std::string::npos) << why;
  }
  {
    Loop run;
    const std::string why = refusal(run, [&](const Tensor& x, const Tensor& y) {
      Tensor l = run.loss(x, y);
      run.optimizer.step();
      return l;
    });
    EXPECT_NE(why.find("optimizer.step() inside a captured step"), std::string::npos) << why;
  }
  {
    MLP model({6, 8, 3}, Activation::kRelu, 1, test_session().device(), test_session().stream());
    DistributedDataParallel ddp(model, test_session(), {.find_unused_parameters = true});
    AdamW optimizer(model, {.lr = 1e-3});
    TrainStep step(test_session(), optimizer, [&](const Tensor& x, const Tensor& y) {
      Tensor l = ops::mse_loss(model.forward(x), y);
      ddp.backward(l);
      return l;
    });
    std::string why = "(accepted)";
    try {
      for (int k = 0; k < 5; ++k) {
        const auto [x, y] = batch(k, 8);
        step(x, y);
      }
    } catch (const Error& e) {
      why = e.what();
    }
    EXPECT_NE(why.find("find_unused_parameters"), std::string::npos) << why;
  }
}

TEST(TrainStep, ANonFiniteLossEndsTheRunOrIsSkipped) {
  auto poisoned = [](int k) {
    auto [x, y] = batch(k, 8);
    if (k == 3 && test_session().rank() == test_session().size() - 1) x.fill_(NAN);
    return std::make_pair(x, y);
  };
  {
    Loop run;
    TrainStep step(test_session(), run.optimizer, [&](const Tensor& x, const Tensor& y) { return run.loss(x, y); },
                   {.skip_nonfinite = true});
    int taken = 0;
    for (int k = 0; k < 6; ++k) {
      const auto [x, y] = poisoned(k);
      taken += step(x, y).taken ? 1 : 0;
    }
    EXPECT_EQ(taken, 5);
    for (float p : parameters(run.model)) ASSERT_TRUE(std::isfinite(p));
  }
  {
    Loop run;
    TrainStep step(test_session(), run.optimizer, [&](const Tensor& x, const Tensor& y) { return run.loss(x, y); },
                   {.cuda_graph = false});
    std::string why = "(accepted)";
    try {
      for (int k = 0; k < 6; ++k) {
        const auto [x, y] = poisoned(k);
        step(x, y, /*read_loss=*/true);
      }
    } catch (const CollectiveError& e) {
      why = e.what();
    }
    EXPECT_NE(why.find("training diverged"), std::string::npos) << why;
    EXPECT_NE(why.find("rank " + std::to_string(test_session().size() - 1)), std::string::npos) << why;
    EXPECT_NE(why.find("set TrainStepOptions::skip_nonfinite = true"), std::string::npos) << why;
  }
}

// A rank's model alone (no DistributedDataParallel), as the in-situ step trains one.
struct LoneLoop {
  MLP model{{6, 16, 16, 3}, Activation::kTanh, 9, test_session().device(), test_session().stream()};
  AdamW optimizer{model, {.lr = 1e-2}};
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor l = ops::mse_loss(model.forward(x), y);
    autograd::backward(l, test_session().stream());
    return l;
  }
};

// `t` with `value` at flat index `i`.
Tensor with_value(const Tensor& t, std::size_t i, float value) {
  std::vector<float> v = t.to_vector<float>(test_session().stream());
  v[i] = value;
  return Tensor::from_vector(v, t.shape(), test_session().device(), test_session().stream());
}

// What a call refused with, "" when it returned.
template <typename Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(TrainStep, ABatchThatIsNotFiniteIsRefusedWithoutAnUpdate) {
  LoneLoop clean, checked;
  TrainStep step(test_session(), checked.optimizer,
                 [&](const Tensor& x, const Tensor& y) { return checked.loss(x, y); },
                 {.eager_steps = 2, .ranks_step_together = false, .refuse_nonfinite_samples = true});
  const std::vector<int> bad = {1, 5, 9, 10, 11};  // eager (1), then replayed on a GPU
  for (int k = 0; k < 14; ++k) {
    auto [x, y] = batch(k, 8);
    const bool poisoned = std::find(bad.begin(), bad.end(), k) != bad.end();
    if (!poisoned) {
      clean.model.zero_grad();
      clean.loss(x, y);
      clean.optimizer.step();
    }
    if (k == 1 || k == 5) {  // read at once
      x = with_value(x, 3 * 6 + 2, NAN);
      const std::string why = refusal([&] { step(x, y, /*read_loss=*/true); });
      EXPECT_NE(why.find("x row 3, column 2"), std::string::npos) << "step " << k << ": " << why;
    } else if (k == 9) {  // found at the next wait
      y = with_value(y, 1 * 3 + 0, -INFINITY);
      EXPECT_EQ(refusal([&] { step(x, y); }), "");
      const std::string why = refusal([&] { step.synchronize(); });
      EXPECT_NE(why.find("y row 1, column 0"), std::string::npos) << why;
    } else if (k == 10 || k == 11) {  // two refused between waits
      x.fill_(k == 10 ? INFINITY : NAN);
      EXPECT_EQ(refusal([&] { step(x, y); }), "");
      if (k == 11) {
        const std::string why = refusal([&] { step.synchronize(); });
        EXPECT_NE(why.find("2 batches since the last wait were refused"), std::string::npos) << why;
        EXPECT_NE(why.find("x row 0, column 0"), std::string::npos) << why;
      }
    } else {
      // Two eager steps taken (0 and 2: the refused 1 is none), then replays.
      EXPECT_EQ(step(x, y, /*read_loss=*/k % 3 == 0).replayed, graphs_possible() && k >= 3) << "step " << k;
    }
  }
  step.synchronize();
  EXPECT_EQ(checked.optimizer.steps(), clean.optimizer.steps());
  EXPECT_EQ(parameters(checked.model), parameters(clean.model));
}

// A data-parallel model: a batch refused on the last rank is the step refused on every rank (agreed on the device,
// so a replay does not wait for it), each rank naming that rank's row and column; the parameters are the bits of
// the data-parallel loop that skipped those steps.
TEST(TrainStep, ABatchRefusedOnOneRankIsTheStepRefusedOnEveryRank) {
  Loop clean, checked;
  TrainStep step(test_session(), checked.optimizer,
                 [&](const Tensor& x, const Tensor& y) { return checked.loss(x, y); },
                 {.eager_steps = 2, .refuse_nonfinite_samples = true});
  const int last = test_session().size() - 1;
  const std::string named =
      test_session().size() > 1 ? "rank " + std::to_string(last) + "'s batch (no rank took the step)" : "";
  // Eager and read at once; a shorter batch on the last rank only (eager there, replayed elsewhere); replayed and
  // read at once; found at a wait.
  const std::vector<int> bad = {1, 4, 6, 9};
  for (int k = 0; k < 12; ++k) {
    auto [x, y] = batch(k, k == 4 && test_session().rank() == last ? 5 : 8);
    const bool poisoned = std::find(bad.begin(), bad.end(), k) != bad.end();
    if (!poisoned) {
      clean.model.zero_grad();
      clean.loss(x, y);
      clean.optimizer.step();
    } else if (test_session().rank() == last && k == 9) {
      y = with_value(y, 1 * 3 + 0, -INFINITY);
    } else if (test_session().rank() == last) {
      x = with_value(x, 3 * 6 + 2, NAN);
    }
    if (k == 1 || k == 4 || k == 6) {
      const std::string why = refusal([&] { step(x, y, /*read_loss=*/true); });
      EXPECT_NE(why.find("x row 3, column 2"), std::string::npos) << "step " << k << ": " << why;
      EXPECT_NE(why.find(named), std::string::npos) << why;
    } else if (k == 9) {
      EXPECT_EQ(refusal([&] { step(x, y); }), "");
      const std::string why = refusal([&] { step.synchronize(); });
      EXPECT_NE(why.find("y row 1, column 0"), std::string::npos) << why;
      EXPECT_NE(why.find(named), std::string::npos) << why;
    } else {
      EXPECT_EQ(step(x, y, /*read_loss=*/k % 3 == 0).replayed, graphs_possible() && k >= 3) << "step " << k;
    }
  }
  step.synchronize();
  EXPECT_EQ(checked.optimizer.steps(), clean.optimizer.steps());
  EXPECT_EQ(parameters(checked.model), parameters(clean.model));
}

// Gradients from a pass of one's own (FusedMlpMse), all-reduced by DistributedDataParallel::reduce_gradients: the
// data-parallel autograd loop's parameters, to float rounding (the fused sums run in another order), eager or
// replayed; the gradients are not zeroed before each step (zero_grad = false), as the pass writes them all.
TEST(TrainStep, AFusedPassReducedLikeABackwardTrainsAsTheAutogradLoop) {
  Session& s = test_session();
  MLP reference_model({6, 32, 32, 3}, Activation::kTanh, 5, s.device(), s.stream());
  MLP fused_model({6, 32, 32, 3}, Activation::kTanh, 5, s.device(), s.stream());
  DistributedDataParallel reference_ddp(reference_model, s), fused_ddp(fused_model, s);
  AdamW reference_opt(reference_model, {.lr = 1e-2}), fused_opt(fused_model, {.lr = 1e-2});
  FusedMlpMse fused(fused_model);
  // The fused pass writes every gradient: the step need not zero them first.
  TrainStep step(s, fused_opt, [&](const Tensor& x, const Tensor& y) {
    Tensor l = fused(x, y, s.stream());
    fused_ddp.reduce_gradients();
    return l;
  }, {.eager_steps = 2, .zero_grad = false});
  for (int k = 0; k < 8; ++k) {
    const auto [x, y] = batch(k, 40);
    reference_opt.zero_grad();
    Tensor l = ops::mse_loss(reference_model.forward(x), y);
    reference_ddp.backward(l);
    reference_opt.step();
    EXPECT_EQ(step(x, y).replayed, graphs_possible() && k >= 2) << "step " << k;
  }
  const std::vector<float> got = parameters(fused_model), want = parameters(reference_model);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5) << "parameter " << i;
}

// zero_grad = false leaves the gradients as they are before the step function runs: a backward then adds to the
// last step's (with a learning rate of 0 the parameters stay, so each step's gradients are the same).
TEST(TrainStep, WithoutZeroGradABackwardAddsToTheLastStepsGradients) {
  MLP model({6, 8, 3}, Activation::kTanh, 2, test_session().device(), test_session().stream());
  Sgd optimizer(model, {.lr = 0.0});
  TrainStep step(test_session(), optimizer, [&](const Tensor& x, const Tensor& y) {
    Tensor l = ops::mse_loss(model.forward(x), y);
    autograd::backward(l, test_session().stream());
    return l;
  }, {.zero_grad = false, .ranks_step_together = false});
  const auto [x, y] = batch(0, 8);
  step(x, y);
  const std::vector<float> once = gradients(model);
  step(x, y);
  step(x, y);
  const std::vector<float> thrice = gradients(model);
  ASSERT_EQ(thrice.size(), once.size());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(thrice[i], 3 * once[i], 1e-5 + 1e-5 * std::abs(once[i]));
}

// The application's arrays allocated once and refilled in place before each step (as a solver does): a replay
// that stages them itself reads each step's values, so the parameters are the loop's that stepped on copies.
TEST(TrainStep, StepsFromArraysRefilledInPlaceTakeEachStepsValues) {
  LoneLoop clean, checked;
  TrainStep step(test_session(), checked.optimizer,
                 [&](const Tensor& x, const Tensor& y) { return checked.loss(x, y); },
                 {.eager_steps = 2, .ranks_step_together = false, .refuse_nonfinite_samples = true});
  Tensor x = Tensor::empty({8, 6}, DType::kFloat32, test_session().device(), test_session().stream());
  Tensor y = Tensor::empty({8, 3}, DType::kFloat32, test_session().device(), test_session().stream());
  for (int k = 0; k < 10; ++k) {
    const auto [bx, by] = batch(k, 8);
    clean.model.zero_grad();
    clean.loss(bx, by);
    clean.optimizer.step();
    x.copy_from(bx, test_session().stream());
    y.copy_from(by, test_session().stream());
    EXPECT_EQ(step(x, y).replayed, graphs_possible() && k >= 2) << "step " << k;
  }
  step.synchronize();
  EXPECT_EQ(parameters(checked.model), parameters(clean.model));
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) { return ddp::testing::run_all_tests_on_a_session(&argc, &argv); }
