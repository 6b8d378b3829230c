// What the training tests that run as MPI ranks on one Session share (the Trainer and TrainStep are given one):
// the Session, made by their main before any test runs, the main itself, and a model's parameters (or their
// gradients) read back for bitwise comparisons. Header only, in each test's srcs: one main per binary.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "runtime/distributed/session.h"
#include "runtime/models/module.h"

namespace ddp::testing {

// Where run_all_tests_on_a_session keeps its Session while the tests run.
inline Session*& session_slot() {
  static Session* session = nullptr;
  return session;
}

inline Session& test_session() { return *session_slot(); }

// A test binary's main: every test on one Session. The exit status is the worst over all ranks, so a failure on
// one rank fails the test even where the others passed.
inline int run_all_tests_on_a_session(int* argc, char*** argv) {
  ::testing::InitGoogleTest(argc, *argv);
  Session session(argc, argv);
  session_slot() = &session;
  const int local = RUN_ALL_TESTS();
  session_slot() = nullptr;
  return session.max(local) > 0 ? 1 : 0;
}

// Every parameter of `model` (or, with `of_gradients`, every parameter's gradient), in state_dict order, on the
// host.
inline std::vector<float> flattened(const Module& model, bool of_gradients) {
  std::vector<float> all;
  for (const auto& [name, t] : model.state_dict()) {
    const std::vector<float> v = (of_gradients ? t.grad() : t).to_vector<float>(test_session().stream());
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}
inline std::vector<float> parameters(const Module& model) { return flattened(model, false); }
inline std::vector<float> gradients(const Module& model) { return flattened(model, true); }

}  // namespace ddp::testing
