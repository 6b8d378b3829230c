// The Trainer as a user's program drives it, at 1 and 2 ranks (on session_tests.h's Session):
//   - hooks run after every step and every epoch's evaluation with the step count, the logged loss and the
//     evaluation; a regression on float targets learns;
//   - a stop asked for from a hook ends fit() with kStoppedExitStatus and a checkpoint at that step, and a new
//     trainer resumed from it ends with bitwise the parameters of a run never stopped;
//   - a training set held in host memory (pinned, copied at each step) trains the bits of one held on the device,
//     for float targets and for labels, across short last batches;
//   - data that does not fit the model, or a loss that does not fit the targets, is refused before any step
//     with a message that says what to change;
//   - a model, a loss and a metric of one's own train and evaluate; a loss of one's own that is not one number
//     is refused before any step; a checkpoint of another loss or architecture is refused on resume.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "ddp.h"
#include "runtime/io/checkpoint.h"
#include "runtime/training/trainer.h"
#include "tests/models/residual_model.h"
#include "tests/scratch.h"
#include "tests/training/session_tests.h"

namespace ddp {
namespace {

using testing::parameters;
using testing::test_session;

// y = (x0·x1, sin(x2)) over n rows of 3 features in [-1, 1], the same on every rank.
data::Dataset regression_set(int64_t n, uint64_t salt) {
  data::Dataset d;
  d.size = n;
  d.feature_count = 3;
  d.target_width = 2;
  for (int64_t i = 0; i < n; ++i) {
    float x[3];
    for (int j = 0; j < 3; ++j) x[j] = std::sin(static_cast<float>(i * 3 + j + salt) * 12.9898f);
    d.features.insert(d.features.end(), x, x + 3);
    d.targets.insert(d.targets.end(), {x[0] * x[1], std::sin(2 * x[2])});
  }
  return d;
}

TrainerOptions quiet_options() {
  return TrainerOptions{.batch_size = 16, .epochs = 3, .loss = Loss::kMse,
                        .optimizer = AdamWOptions{.lr = 1e-2, .weight_decay = 0}, .log_every = 10,
                        .name = "trainer_test"};
}

TEST(Trainer, HooksSeeEveryStepAndEveryEvaluationAndTheRegressionLearns) {
  Session& s = test_session();
  const data::Dataset train = regression_set(256, 0), test = regression_set(64, 1000);
  MLP model({3, 32, 2}, Activation::kTanh, 1, s.device(), s.stream());
  std::vector<int64_t> steps;
  std::vector<double> logged, evaluated;
  TrainerHooks hooks{
      .on_step_end = [&](const StepEnd& e) {
        steps.push_back(e.step);
        if (e.logged) logged.push_back(e.loss);
      },
      .on_evaluation = [&](const EvaluationResult& r) { evaluated.push_back(r.loss); }};
  Trainer trainer(s, model, quiet_options(), hooks);
  ASSERT_EQ(trainer.fit(train, test), 0);
  const int64_t per_epoch = (256 / s.size() + 15) / 16;
  ASSERT_EQ(static_cast<int64_t>(steps.size()), 3 * per_epoch);
  for (std::size_t k = 0; k < steps.size(); ++k) EXPECT_EQ(steps[k], static_cast<int64_t>(k) + 1);
  ASSERT_EQ(evaluated.size(), 3u);
  EXPECT_LT(evaluated.back(), evaluated.front());
  EXPECT_LT(evaluated.back(), 0.1);
  EXPECT_EQ(trainer.last_evaluation().accuracy, -1.0);  // a regression has no accuracy
  EXPECT_FALSE(logged.empty());
}

TEST(Trainer, AStopFromAHookCheckpointsThereAndTheResumedRunEndsAsOneNeverStopped) {
  Session& s = test_session();
  const data::Dataset train = regression_set(200, 7), test;
  const std::string dir = testing::scratch_path("trainer_stop_" + std::to_string(s.size()));
  if (s.is_lead()) testing::fresh_scratch_dir("trainer_stop_" + std::to_string(s.size()));
  s.agree("", "scratch");  // the directory is fresh before any rank looks

  MLP straight({3, 16, 2}, Activation::kRelu, 2, s.device(), s.stream());
  ASSERT_EQ(Trainer(s, straight, quiet_options()).fit(train, test), 0);

  MLP stopped({3, 16, 2}, Activation::kRelu, 2, s.device(), s.stream());
  TrainerOptions o = quiet_options();
  o.checkpoint_dir = dir;
  TrainerHooks stop_at_5{.on_step_end = [](const StepEnd& e) {
    if (e.step == 5) request_stop();
  }};
  ASSERT_EQ(Trainer(s, stopped, o, stop_at_5).fit(train, test), kStoppedExitStatus);
  clear_stop_request();
  const auto saved = io::list_checkpoints(dir);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved.back().step, 5);

  MLP resumed({3, 16, 2}, Activation::kRelu, 99, s.device(), s.stream());  // another init: the checkpoint wins
  o.resume_dir = dir;
  Trainer again(s, resumed, o);
  ASSERT_EQ(again.fit(train, test), 0);
  EXPECT_EQ(parameters(resumed), parameters(straight));
}

// A model of one's own through what the MLP gets: ZeRO-1, a Dropout drawing from its counter, TensorBoard, metrics
// and ONNX outputs, a stop and a resume ending with the bits of a run never stopped.
TEST(Trainer, AResidualDropoutModelShardedStopsAndResumesAsOneNeverStopped) {
  Session& s = test_session();
  const data::Dataset train = regression_set(200, 9), test = regression_set(64, 900);
  const std::string name = "trainer_residual_" + std::to_string(s.size());
  const std::string dir = testing::scratch_path(name);
  if (s.is_lead()) testing::fresh_scratch_dir(name);
  s.agree("", "scratch");
  auto make = [&](std::uint64_t seed) {
    auto model = std::make_shared<Sequential>();
    model->add(test::residual_layer_norm_gelu_model(seed, s.device(), s.stream(), 3, 16, 2));
    model->add(std::make_shared<Dropout>(0.1, 5, s.device(), s.stream()));
    return model;
  };
  TrainerOptions o = quiet_options();
  o.shard_optimizer = true;
  const auto straight = make(4);
  ASSERT_EQ(Trainer(s, *straight, o).fit(train, test), 0);

  o.checkpoint_dir = dir + "/ckpt";
  o.metrics_file = dir + "/metrics.jsonl";
  o.tensorboard_dir = dir + "/tb";
  o.onnx_file = dir + "/model.onnx";
  const auto stopped = make(4);
  TrainerHooks stop_at_7{.on_step_end = [](const StepEnd& e) {
    if (e.step == 7) request_stop();
  }};
  ASSERT_EQ(Trainer(s, *stopped, o, stop_at_7).fit(train, test), kStoppedExitStatus);
  clear_stop_request();
  const auto resumed = make(77);  // another init: the checkpoint wins, the Dropout's draw count included
  o.resume_dir = o.checkpoint_dir;
  ASSERT_EQ(Trainer(s, *resumed, o).fit(train, test), 0);
  EXPECT_EQ(parameters(*resumed), parameters(*straight));
  if (s.is_lead()) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/model.onnx"));
    EXPECT_FALSE(std::filesystem::is_empty(dir + "/tb"));
  }
}

TEST(Trainer, ATrainingSetInHostMemoryTrainsTheBitsOfOneOnTheDevice) {
  Session& s = test_session();
  data::Dataset labelled = regression_set(200, 11);
  labelled.target_width = 0;
  labelled.targets.clear();
  labelled.num_classes = 3;
  for (int64_t i = 0; i < labelled.size; ++i) labelled.labels.push_back(static_cast<int32_t>(i * 7 % 3));
  for (const data::Dataset& train : {regression_set(200, 5), labelled}) {
    const bool regression = train.regression();
    std::vector<std::vector<double>> losses;
    std::vector<std::vector<float>> trained;
    for (DataPlacement placement : {DataPlacement::kDevice, DataPlacement::kHost}) {
      MLP model({3, 16, regression ? 2 : 3}, Activation::kRelu, 4, s.device(), s.stream());
      TrainerOptions o = quiet_options();
      o.data_placement = placement;
      o.log_every = 1;
      if (!regression) o.loss = Loss::kCrossEntropy;
      std::vector<double> logged;
      TrainerHooks hooks{.on_step_end = [&](const StepEnd& e) { logged.push_back(e.loss); }};
      ASSERT_EQ(Trainer(s, model, o, hooks).fit(train, data::Dataset{}), 0);
      losses.push_back(logged);
      trained.push_back(parameters(model));
    }
    const std::string what = regression ? "float targets" : "labels";
    EXPECT_EQ(losses[1], losses[0]) << what;
    EXPECT_EQ(trained[1], trained[0]) << what;
  }
}

TEST(Trainer, DataOrALossThatDoesNotFitTheModelIsRefusedBeforeAnyStep) {
  Session& s = test_session();
  const data::Dataset train = regression_set(64, 3);
  auto refusal = [&](const std::vector<int64_t>& sizes, Loss loss) -> std::string {
    MLP model(sizes, Activation::kRelu, 0, s.device(), s.stream());
    TrainerOptions o = quiet_options();
    o.loss = loss;
    try {
      Trainer(s, model, o).fit(train, data::Dataset{});
    } catch (const CollectiveError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(refusal({4, 8, 2}, Loss::kMse).find("3 features per sample, the model's input has 4"), std::string::npos);
  EXPECT_NE(refusal({3, 8, 5}, Loss::kMse).find("targets have width 2, the model's output has 5"), std::string::npos);
  EXPECT_NE(refusal({3, 8, 2}, Loss::kCrossEntropy).find("use the mse loss"), std::string::npos);
}

// A model of one's own: a skip connection around a hidden layer, nothing the MLP could express.
class SkipNet : public Module {
 public:
  SkipNet(const Device& device, const Stream& stream) {
    register_module("input", input_ = std::make_shared<Linear>(3, 16, true, 7, 0, device, stream));
    register_module("hidden", hidden_ = std::make_shared<Linear>(16, 16, true, 7, 100, device, stream));
    register_module("output", output_ = std::make_shared<Linear>(16, 2, true, 7, 400, device, stream));
  }
  Tensor forward(const Tensor& x, const Stream& stream) override {
    const Tensor h = ops::activation(input_->forward(x, stream), Activation::kTanh, stream);
    return output_->forward(ops::add(h, ops::activation(hidden_->forward(h, stream), Activation::kTanh, stream),
                                     stream),
                            stream);
  }
  std::string type_name() const override { return "SkipNet"; }

 private:
  std::shared_ptr<Linear> input_, hidden_, output_;
};

// Half the mean squared error, as a loss of one's own through the ops.
Tensor half_mse(const Tensor& output, const Tensor& target) { return ops::scale(ops::mse_loss(output, target), 0.5); }

TEST(Trainer, AModelLossAndMetricOfOnesOwnTrainAndEvaluate) {
  Session& s = test_session();
  const data::Dataset train = regression_set(256, 0), test = regression_set(64, 1000);
  SkipNet model(s.device(), s.stream());
  TrainerOptions o = quiet_options();
  o.loss_function = half_mse;
  o.loss_function_name = "half-mse";
  o.metrics = {{"mse", [](const Tensor& out, const Tensor& y) { return ops::mse_loss(out, y); }}};
  std::vector<double> evaluated;
  TrainerHooks hooks{.on_evaluation = [&](const EvaluationResult& e) {
    ASSERT_EQ(e.metrics.size(), 1u);
    EXPECT_EQ(e.metrics[0].first, "mse");
    EXPECT_NEAR(e.metrics[0].second, 2 * e.loss, 1e-6 * e.metrics[0].second);
    EXPECT_EQ(e.accuracy, -1);
    evaluated.push_back(e.loss);
  }};
  Trainer trainer(s, model, o, hooks);
  ASSERT_EQ(trainer.fit(train, test), 0);
  ASSERT_EQ(evaluated.size(), 3u);
  EXPECT_LT(evaluated.back(), 0.6 * evaluated.front());  // 0.0621 -> 0.0326 on 1 rank
}

TEST(Trainer, ALossOfOnesOwnThatIsNotOneNumberIsRefusedBeforeAnyStep) {
  Session& s = test_session();
  SkipNet model(s.device(), s.stream());
  TrainerOptions o = quiet_options();
  o.loss_function = [](const Tensor& output, const Tensor&) { return output; };
  std::string why = "(accepted)";
  try {
    Trainer(s, model, o).fit(regression_set(64, 3), data::Dataset{});
  } catch (const CollectiveError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("TrainerOptions::loss_function must return the batch's mean loss, a float32 tensor of one "
                     "element; for one sample it returned float32 [1, 2]"),
            std::string::npos)
      << why;
}

TEST(Trainer, ACheckpointOfAnotherLossOrArchitectureIsRefusedNamingIt) {
  Session& s = test_session();
  const data::Dataset train = regression_set(64, 4);
  const std::string shared = testing::scratch_path("trainer_recipe_" + std::to_string(s.size()));
  if (s.is_lead()) testing::fresh_scratch_dir("trainer_recipe_" + std::to_string(s.size()));
  s.agree("", "scratch");  // the directory is fresh before any rank looks
  {
    MLP model({3, 16, 2}, Activation::kTanh, 1, s.device(), s.stream());
    TrainerOptions o = quiet_options();
    o.epochs = 1;
    o.checkpoint_dir = shared;
    ASSERT_EQ(Trainer(s, model, o).fit(train, data::Dataset{}), 0);
  }
  auto refusal = [&](Module& model, const BatchFunction& loss) {
    TrainerOptions o = quiet_options();
    o.epochs = 2;
    o.resume_dir = shared;
    o.loss_function = loss;
    if (loss) o.loss_function_name = "half-mse";
    try {
      Trainer(s, model, o).fit(train, data::Dataset{});
    } catch (const CollectiveError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  MLP same({3, 16, 2}, Activation::kTanh, 1, s.device(), s.stream());
  const std::string loss = refusal(same, half_mse);
  EXPECT_NE(loss.find("was written with TrainerOptions::loss mse, this run has TrainerOptions::loss half-mse"),
            std::string::npos)
      << loss;
  // The same parameters, another activation between them: the architecture tells them apart.
  Sequential other;
  other.add(std::make_shared<Linear>(3, 16, true, 1, 0, s.device(), s.stream()));
  other.add(std::make_shared<ActivationLayer>(Activation::kGelu));
  other.add(std::make_shared<Linear>(16, 2, true, 1, 64, s.device(), s.stream()));
  const std::string architecture = refusal(other, nullptr);
  EXPECT_NE(architecture.find("was written by a model Sequential(Linear,Tanh,Linear), this run's model is "
                              "Sequential(Linear,GELU,Linear) (the same parameters, other layers)"),
            std::string::npos)
      << architecture;
  // Other parameters: loading names those the model does not have.
  SkipNet skip(s.device(), s.stream());
  const std::string parameters = refusal(skip, nullptr);
  EXPECT_NE(parameters.find("holds tensors this model and optimizer do not have: 0.weight"), std::string::npos)
      << parameters;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) { return ddp::testing::run_all_tests_on_a_session(&argc, &argv); }
