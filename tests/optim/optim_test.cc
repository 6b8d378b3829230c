// Optimizer steps against torch.optim's formulas written out by hand in double precision: SGD plain, with
// weight decay, momentum (first-step buffer = gradient), dampening and Nesterov; AdamW with decoupled decay
// and bias correction; the LR schedules; and gradient-norm clipping against torch.nn.utils.clip_grad_norm_'s
// formula.
#include "runtime/autograd/optimizer_shard.h"
#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/autograd/autograd.h"
#include "runtime/core/check.h"
#include "runtime/optim/clip_grad.h"

namespace ddp {
namespace {

const Stream& S() { return cpu_stream(); }

// A store with two parameters ([2] and [3]) and per-step gradients we set by hand.
struct Fixture {
  Tensor a = Tensor::from_vector({0.5f, -1.0f}, {2}, Device::cpu(), S());
  Tensor b = Tensor::from_vector({2.0f, 0.25f, -0.75f}, {3}, Device::cpu(), S());
  ParameterStore store{{{"a", a}, {"b", b}}, Device::cpu(), S(), {1, 0}};
  std::vector<double> p{0.5, -1.0, 2.0, 0.25, -0.75};  // registration order
  std::vector<double> grads(int step) const {
    std::vector<double> g(5);
    for (int i = 0; i < 5; ++i) g[i] = std::sin(1.0 + i + 3.0 * step);
    return g;
  }
  void set_grads(int step) {
    std::vector<double> g = grads(step);
    float* ga = store.slot(0).grad.data<float>();
    float* gb = store.slot(1).grad.data<float>();
    for (int i = 0; i < 2; ++i) ga[i] = static_cast<float>(g[i]);
    for (int i = 0; i < 3; ++i) gb[i] = static_cast<float>(g[2 + i]);
  }
  // Gradients as backward leaves them: written and current.
  void set_current_grads(int step) {
    set_grads(step);
    for (const ParameterSlot& slot : store.slots()) slot.param.autograd_meta().grad_valid = true;
  }
  std::vector<float> gradient_values() const {
    std::vector<float> v = store.slot(0).grad.to_vector<float>(S());
    for (float x : store.slot(1).grad.to_vector<float>(S())) v.push_back(x);
    return v;
  }
  std::vector<float> values() const {
    std::vector<float> v = a.to_vector<float>(S());
    for (float x : b.to_vector<float>(S())) v.push_back(x);
    return v;
  }
};

void run_sgd(const SgdOptions& o) {
  Fixture f;
  Sgd sgd(f.store, o, S());
  std::vector<double> buf(5, 0.0);
  for (int step = 0; step < 4; ++step) {
    f.set_grads(step);
    sgd.step(S());
    std::vector<double> g = f.grads(step);
    for (int i = 0; i < 5; ++i) {
      double d = g[i] + o.weight_decay * f.p[i];
      if (o.momentum != 0) {
        buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      f.p[i] -= o.lr * d;
    }
    std::vector<float> v = f.values();
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(v[i], f.p[i], 1e-6) << "step " << step << " element " << i;
  }
  EXPECT_EQ(sgd.steps(), 4);
}

TEST(Sgd, Plain) { run_sgd({0.1f, 0.0f, 0.0f, 0.0f, false}); }
TEST(Sgd, WeightDecay) { run_sgd({0.1f, 0.0f, 0.0f, 0.05f, false}); }
TEST(Sgd, MomentumFirstStepInitialisesBuffer) { run_sgd({0.1f, 0.9f, 0.0f, 0.0f, false}); }
TEST(Sgd, MomentumDampeningWeightDecay) { run_sgd({0.05f, 0.8f, 0.3f, 0.01f, false}); }
TEST(Sgd, Nesterov) { run_sgd({0.1f, 0.9f, 0.0f, 0.01f, true}); }

TEST(Sgd, RejectsNesterovWithoutMomentum) {
  Fixture f;
  EXPECT_THROW(Sgd(f.store, {0.1f, 0.0f, 0.0f, 0.0f, true}, S()), Error);
  EXPECT_THROW(Sgd(f.store, {0.1f, 0.9f, 0.1f, 0.0f, true}, S()), Error);
}

TEST(AdamW, MatchesTorchFormula) {
  Fixture f;
  AdamWOptions o;
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  AdamW adam(f.store, o, S());
  std::vector<double> m(5, 0), v(5, 0);
  for (int step = 1; step <= 5; ++step) {
    f.set_grads(step);
    adam.step(S());
    std::vector<double> g = f.grads(step);
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
    for (int i = 0; i < 5; ++i) {
      f.p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + 1e-8;
      f.p[i] -= o.lr / bc1 * m[i] / denom;
    }
    std::vector<float> got = f.values();
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(got[i], f.p[i], 2e-6) << "step " << step << " element " << i;
  }
  // State follows the store's layout: b (slot 1) first.
  ASSERT_EQ(adam.state().size(), 2u);
  const std::vector<float> exp_avg = adam.state()[0].second.to_vector<float>(S());
  EXPECT_NEAR(exp_avg[f.store.slot(1).offset], m[2], 1e-6);
  EXPECT_NEAR(exp_avg[f.store.slot(0).offset], m[0], 1e-6);
}

// Mixed precision: the step writes bfloat16(updated parameter) into the attached copy, bit for bit what a
// separate cast of the parameters gives, for both optimizers and every step.
TEST(Optimizer, Bf16CopyIsTheRoundedParametersAfterEveryStep) {
  for (int which = 0; which < 2; ++which) {
    Fixture f;
    std::unique_ptr<Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<Sgd>(f.store, SgdOptions{0.1, 0.9, 0.0, 0.01, false}, S());
    } else {
      opt = std::make_unique<AdamW>(f.store, AdamWOptions{}, S());
    }
    const std::int64_t n = f.store.total_numel();
    Tensor copy = Tensor::full({n}, 7.0, DType::kBFloat16, Device::cpu(), S());
    opt->set_bf16_copy(copy);
    for (int step = 0; step < 3; ++step) {
      f.set_grads(step);
      opt->step(S());
      const Tensor expected = f.store.flat_params().to_dtype(DType::kBFloat16, S());
      const auto* got_bits = static_cast<const std::uint16_t*>(copy.data_ptr());
      const auto* want_bits = static_cast<const std::uint16_t*>(expected.data_ptr());
      for (std::int64_t i = 0; i < n; ++i)
        EXPECT_EQ(got_bits[i], want_bits[i]) << (which == 0 ? "sgd" : "adamw") << " step " << step << " element " << i;
    }
  }
  Fixture f;
  Sgd sgd(f.store, {0.1, 0.0, 0.0, 0.0, false}, S());
  EXPECT_THROW(sgd.set_bf16_copy(Tensor::zeros({f.store.total_numel()}, DType::kFloat32, Device::cpu(), S())), Error);
  EXPECT_THROW(sgd.set_bf16_copy(Tensor::zeros({f.store.total_numel() + 1}, DType::kBFloat16, Device::cpu(), S())),
               Error);
}

// The graph-capturable split of a step: with the scalars in (here host) memory written by prepare_step, a
// schedule that changes the learning rate every step gives bitwise the parameters and state of plain steps.
template <typename MakeOptimizer>
void expect_device_scalars_match_plain_steps(MakeOptimizer make) {
  Fixture plain_f, split_f;
  std::unique_ptr<Optimizer> plain = make(plain_f.store);
  std::unique_ptr<Optimizer> split = make(split_f.store);
  split->use_device_scalars(S());
  ASSERT_TRUE(split->device_scalars());
  const CosineWithWarmup schedule(0.1, 2, 6);
  for (int step = 0; step < 6; ++step) {
    plain_f.set_grads(step);
    split_f.set_grads(step);
    schedule.apply(*plain);
    schedule.apply(*split);
    plain->step(S());
    split->prepare_step(S());
    split->set_lr(123.0);  // the prepared scalars are what the update uses, not the value now
    split->apply_step(S());
  }
  EXPECT_EQ(split->steps(), plain->steps());
  EXPECT_EQ(split_f.values(), plain_f.values());
  for (std::size_t k = 0; k < plain->state().size(); ++k) {
    EXPECT_EQ(split->state()[k].second.to_vector<float>(S()), plain->state()[k].second.to_vector<float>(S()))
        << plain->state()[k].first;
  }
}

TEST(Optimizer, DeviceScalarsGiveTheBitsOfPlainSgdSteps) {
  expect_device_scalars_match_plain_steps([](ParameterStore& store) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Sgd>(store, SgdOptions{0.1, 0.9, 0.1, 0.01, false}, S());
  });
}

TEST(Optimizer, DeviceScalarsGiveTheBitsOfPlainAdamWSteps) {
  expect_device_scalars_match_plain_steps([](ParameterStore& store) -> std::unique_ptr<Optimizer> {
    return std::make_unique<AdamW>(store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());
  });
}

// The planned scalars of a graph (plan_steps: a table made once, a row taken per apply_step) give bitwise the
// parameters and state of plain steps under a schedule that changes the learning rate every step; a step past
// the plan, or a learning rate other than the planned one, is refused by name.
template <typename MakeOptimizer>
void expect_planned_steps_match_plain_steps(MakeOptimizer make) {
  Fixture plain_f, planned_f;
  std::unique_ptr<Optimizer> plain = make(plain_f.store);
  std::unique_ptr<Optimizer> planned = make(planned_f.store);
  const CosineWithWarmup schedule(0.1, 2, 6);
  // One plain step first, so the plan starts mid-run (as after a resume or eager warm-up steps).
  for (Fixture* f : {&plain_f, &planned_f}) f->set_grads(0);
  schedule.apply(*plain);
  schedule.apply(*planned);
  plain->step(S());
  planned->step(S());
  planned->plan_steps(schedule, 5, S());
  ASSERT_TRUE(planned->planned());
  for (int step = 1; step < 6; ++step) {
    plain_f.set_grads(step);
    planned_f.set_grads(step);
    schedule.apply(*plain);
    schedule.apply(*planned);
    plain->step(S());
    planned->step(S());
  }
  EXPECT_EQ(planned_f.values(), plain_f.values());
  for (std::size_t k = 0; k < plain->state().size(); ++k) {
    EXPECT_EQ(planned->state()[k].second.to_vector<float>(S()), plain->state()[k].second.to_vector<float>(S()))
        << plain->state()[k].first;
  }
  try {
    planned->prepare_step(S());
    FAIL() << "a step past the plan was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("step 7 is past the 5 steps planned from step 2"), std::string::npos)
        << e.what();
  }
  planned->plan_steps(schedule, 2, S());
  planned->set_lr(0.5);
  try {
    planned->prepare_step(S());
    FAIL() << "a learning rate other than the planned one was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has learning rate 0.5"), std::string::npos) << e.what();
  }
}

TEST(Optimizer, PlannedStepsGiveTheBitsOfPlainSgdSteps) {
  expect_planned_steps_match_plain_steps([](ParameterStore& store) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Sgd>(store, SgdOptions{0.1, 0.9, 0.1, 0.01, false}, S());
  });
}

TEST(Optimizer, PlannedStepsGiveTheBitsOfPlainAdamWSteps) {
  expect_planned_steps_match_plain_steps([](ParameterStore& store) -> std::unique_ptr<Optimizer> {
    return std::make_unique<AdamW>(store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());
  });
}

// DistributedDataParallel re-lays the store out in bucket order. An optimizer made before that (the order a user
// may well write) follows the new layout while its state is untouched, and gives the steps of one made after;
// once it has stepped it refuses, saying which order works.
TEST(Optimizer, FollowsANewLayoutUntilItHasStepped) {
  Fixture before, after;
  AdamW early(before.store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());
  before.store.relayout({0, 1}, S());
  after.store.relayout({0, 1}, S());
  AdamW late(after.store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());
  for (int step = 0; step < 3; ++step) {
    before.set_grads(step);
    after.set_grads(step);
    early.step(S());
    late.step(S());
  }
  EXPECT_EQ(before.values(), after.values());
  EXPECT_EQ(early.state()[0].second.to_vector<float>(S()), late.state()[0].second.to_vector<float>(S()));

  before.store.relayout({1, 0}, S());
  try {
    early.step(S());
    FAIL() << "stepped with state laid out for another order of the parameters";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("construct DistributedDataParallel before stepping the optimizer"),
              std::string::npos)
        << e.what();
  }
}

// An OptimizerShard of one process that owns some spans: it records what the optimizer tells it and, as the
// other ranks would, writes `gathered` into the spans it does not own when the update finishes.
class FakeShard : public OptimizerShard {
 public:
  FakeShard(std::vector<FlatSpan> owned, Tensor params) : owned_(std::move(owned)), params_(std::move(params)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<FlatSpan>& owned(int) const override { return owned_; }
  void span_updated(std::size_t k, const Stream&) override { updated.push_back(k); }
  void finish_update(const Stream&) override {
    ++finished;
    float* p = params_.data<float>();
    std::int64_t at = 0;
    for (const FlatSpan& s : owned_) {
      for (std::int64_t i = at; i < s.offset; ++i) p[i] = gathered;
      at = s.end();
    }
    for (std::int64_t i = at; i < params_.numel(); ++i) p[i] = gathered;
  }
  double sum(double value) override { return value + others_sum; }
  void gather_to_first(FlatSpan, const float*, float*) override {}

  std::vector<std::size_t> updated;
  int finished = 0;
  float gathered = 0.375f;
  double others_sum = 0;

 private:
  std::vector<FlatSpan> owned_;
  Tensor params_;
};

// Sharded, the optimizer keeps state for its spans only, updates them with the unsharded arithmetic (the same
// bits), tells the shard after each span and once at the end, and refreshes the bf16 copy of the spans the other
// ranks updated from the gathered parameters.
TEST(Optimizer, ShardedItUpdatesAndKeepsStateForItsOwnSpansOnly) {
  Fixture plain, sharded;  // flat layout: b at [0, 3), padding, a at [16, 18)
  const std::vector<FlatSpan> mine = {{1, 2}, {16, 1}};  // b[1..2] and a[0]
  auto shard = std::make_shared<FakeShard>(mine, sharded.store.flat_params());
  AdamW reference(plain.store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());
  AdamW early(sharded.store, AdamWOptions{1e-2, 0.9, 0.999, 1e-8, 0.05}, S());  // made before the shard is set
  sharded.store.set_optimizer_shard(shard);
  Tensor copy = Tensor::zeros({sharded.store.total_numel()}, DType::kBFloat16, Device::cpu(), S());
  early.set_bf16_copy(copy);
  for (int step = 0; step < 3; ++step) {
    plain.set_grads(step);
    sharded.set_grads(step);
    reference.step(S());
    early.step(S());
  }
  ASSERT_TRUE(early.sharded());
  EXPECT_EQ(early.state()[0].second.numel(), 3);
  EXPECT_EQ(shard->updated, (std::vector<std::size_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(shard->finished, 3);
  const std::vector<float> want = plain.store.flat_params().to_vector<float>(S());
  const std::vector<float> got = sharded.store.flat_params().to_vector<float>(S());
  const std::vector<float> want_m = reference.state()[0].second.to_vector<float>(S());
  const std::vector<float> got_m = early.state()[0].second.to_vector<float>(S());
  std::int64_t state_offset = 0;
  for (const FlatSpan& span : mine) {
    for (std::int64_t i = 0; i < span.count; ++i) {
      EXPECT_EQ(got[span.offset + i], want[span.offset + i]) << "element " << span.offset + i;
      EXPECT_EQ(got_m[state_offset + i], want_m[span.offset + i]) << "exp_avg of element " << span.offset + i;
    }
    state_offset += span.count;
  }
  EXPECT_EQ(got[0], shard->gathered);   // another rank's element, as gathered
  EXPECT_EQ(got[17], shard->gathered);
  const Tensor expected_copy = sharded.store.flat_params().to_dtype(DType::kBFloat16, S());
  EXPECT_EQ(std::memcmp(copy.data_ptr(), expected_copy.data_ptr(), 2 * static_cast<std::size_t>(copy.numel())), 0)
      << "the bf16 copy is not bf16 of every updated or gathered parameter";
}

// Sharded clipping: this rank's share of the sum of squares plus the others' (OptimizerShard::sum) is the norm,
// and only this rank's spans are scaled.
TEST(ClipGradNorm, ShardedTheNormIsTheSumOverTheShards) {
  Fixture f;
  auto shard = std::make_shared<FakeShard>(std::vector<FlatSpan>{{0, 2}}, f.store.flat_params());
  f.store.set_optimizer_shard(shard);
  f.set_current_grads(0);
  const std::vector<float> g = f.store.flat_grads().to_vector<float>(S());
  const double mine = static_cast<double>(g[0]) * g[0] + static_cast<double>(g[1]) * g[1];
  shard->others_sum = 2.25;
  const double norm = clip_grad_norm(f.store, 0.5, S());
  EXPECT_DOUBLE_EQ(norm, std::sqrt(mine + 2.25));
  const std::vector<float> after = f.store.flat_grads().to_vector<float>(S());
  const float c = static_cast<float>(0.5 / (norm + 1e-6));
  EXPECT_FLOAT_EQ(after[0], g[0] * c);
  EXPECT_FLOAT_EQ(after[1], g[1] * c);
  EXPECT_EQ(after[2], g[2]) << "another rank's span was scaled";
}

TEST(LrSchedule, ConstantAndCosineWithWarmup) {
  EXPECT_EQ(ConstantLr(0.3).lr_at(1000), 0.3);
  CosineWithWarmup s(1.0, 4, 14, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1.0);            // cosine starts at the base
  EXPECT_NEAR(s.lr_at(9), 0.1 + 0.45, 1e-12);   // halfway: midpoint
  EXPECT_DOUBLE_EQ(s.lr_at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.1);
  for (int i = 5; i < 14; ++i) EXPECT_LT(s.lr_at(i), s.lr_at(i - 1));
  Fixture f;
  Sgd sgd(f.store, {0.5f, 0.0f, 0.0f, 0.0f, false}, S());
  s.apply(sgd);
  EXPECT_FLOAT_EQ(sgd.lr(), 0.25f);
  EXPECT_THROW(CosineWithWarmup(1.0, 5, 4), Error);
}

TEST(ClipGradNorm, ScalesEveryGradientByMaxNormOverTheTotalNorm) {
  Fixture f;
  f.set_current_grads(0);
  const std::vector<double> g = f.grads(0);
  double sum = 0;
  for (double v : g) sum += v * v;
  const double norm = std::sqrt(sum);
  const double max_norm = 0.5 * norm;
  EXPECT_NEAR(clip_grad_norm(f.store, max_norm, S()), norm, 1e-6 * norm);
  const std::vector<float> got = f.gradient_values();
  double clipped = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(got[i], g[i] * max_norm / (norm + 1e-6), 1e-6) << "element " << i;
    clipped += static_cast<double>(got[i]) * got[i];
  }
  EXPECT_NEAR(std::sqrt(clipped), max_norm, 1e-5);
}

TEST(ClipGradNorm, LeavesGradientsBelowMaxNormUntouched) {
  Fixture f;
  f.set_current_grads(1);
  const std::vector<float> before = f.gradient_values();
  double sum = 0;
  for (float v : before) sum += static_cast<double>(v) * v;
  EXPECT_NEAR(clip_grad_norm(f.store, 2.0 * std::sqrt(sum), S()), std::sqrt(sum), 1e-6);
  EXPECT_EQ(f.gradient_values(), before);
}

TEST(ClipGradNorm, GradientsThatAreNotCurrentCountAsZero) {
  Fixture f;
  f.set_current_grads(2);
  // `a` was zeroed lazily after its gradient was written: its stale contents must neither count nor change.
  autograd::zero_grad({f.store.slot(0).param});
  const std::vector<float> stale_a = f.store.slot(0).grad.to_vector<float>(S());
  const std::vector<double> g = f.grads(2);
  const double norm = std::sqrt(g[2] * g[2] + g[3] * g[3] + g[4] * g[4]);
  EXPECT_NEAR(clip_grad_norm(f.store, 0.25 * norm, S()), norm, 1e-6 * norm);
  EXPECT_EQ(f.store.slot(0).grad.to_vector<float>(S()), stale_a);
  const std::vector<float> b = f.store.slot(1).grad.to_vector<float>(S());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(b[i], g[2 + i] * 0.25 * norm / (norm + 1e-6), 1e-6);
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradientsForTheCallerToSkip) {
  Fixture f;
  f.set_current_grads(3);
  f.store.slot(1).grad.data<float>()[1] = std::nanf("");
  const std::vector<float> before = f.gradient_values();
  EXPECT_TRUE(std::isnan(clip_grad_norm(f.store, 1e-3, S())));
  const std::vector<float> after = f.gradient_values();
  for (int i = 0; i < 5; ++i) {
    if (std::isnan(before[i])) continue;
    EXPECT_EQ(after[i], before[i]) << "element " << i;
  }
}

TEST(ClipGradNorm, RejectsANonPositiveMaxNorm) {
  Fixture f;
  f.set_current_grads(0);
  EXPECT_THROW(clip_grad_norm(f.store, 0.0, S()), InvalidArgument);
  EXPECT_THROW(clip_grad_norm(f.store, -1.0, S()), InvalidArgument);
}

}  // namespace
}  // namespace ddp
