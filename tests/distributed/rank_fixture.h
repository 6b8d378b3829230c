// The fixture the multi-rank suites share: this rank's device (the World's binding), a stream on it and a
// process group over every rank on the device's default backend, made once per test.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/distributed/process_group.h"
#include "tests/distributed/test_world.h"

namespace ddp::testing {

class RankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    World& w = test_world();
    device_ = w.device();
    stream_ = Stream::create(device_);
    group_ = make_process_group(w, device_, default_backend(device_));
    rank_ = w.rank();
    size_ = w.size();
  }

  Device device_;
  Stream stream_;
  std::unique_ptr<ProcessGroup> group_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace ddp::testing
