// The replay buffer against a reference: what it holds is exactly the newest `capacity` samples added, a batch
// draws only from those, the same (seed, draw) gives the same batch, and its memory never grows.
#include "runtime/data/replay_buffer.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "runtime/core/check.h"

namespace ddp::data {
namespace {

TEST(ReplayBuffer, HoldsTheNewestCapacitySamplesAndDrawsOnlyThose) {
  ReplayBuffer buffer(4, 2, 1);
  const std::int64_t bytes = buffer.bytes();
  EXPECT_EQ(bytes, 4 * 3 * static_cast<std::int64_t>(sizeof(float)));
  // Sample i is (i, -i) -> 10 i.
  for (int round = 0; round < 3; ++round) {
    std::vector<float> x, y;
    for (int i = round * 3; i < round * 3 + 3; ++i) {
      x.insert(x.end(), {float(i), float(-i)});
      y.push_back(10.0f * i);
    }
    buffer.add(x.data(), y.data(), 3);
  }
  EXPECT_EQ(buffer.size(), 4);
  EXPECT_EQ(buffer.added(), 9);
  EXPECT_EQ(buffer.bytes(), bytes);
  std::vector<float> x(2 * 64), y(64);
  buffer.sample(64, 7, 0, x.data(), y.data());
  std::set<int> seen;
  for (int i = 0; i < 64; ++i) {
    const int id = static_cast<int>(x[2 * i]);
    EXPECT_GE(id, 5);  // samples 5..8 are the newest four
    EXPECT_EQ(x[2 * i + 1], -float(id));
    EXPECT_EQ(y[i], 10.0f * id);
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 4u);
  std::vector<float> x2(2 * 64), y2(64);
  buffer.sample(64, 7, 0, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  buffer.sample(64, 7, 1, x2.data(), y2.data());
  EXPECT_NE(x, x2);
}

TEST(ReplayBuffer, RefusesEmptyDrawsAndBadSizes) {
  EXPECT_THROW(ReplayBuffer(0, 2, 1), InvalidArgument);
  ReplayBuffer buffer(3, 1, 1);
  float x = 0, y = 0;
  EXPECT_THROW(buffer.sample(1, 0, 0, &x, &y), InvalidArgument);
  // A batch larger than the buffer keeps its newest samples.
  const std::vector<float> xs = {1, 2, 3, 4, 5}, ys = {1, 2, 3, 4, 5};
  buffer.add(xs.data(), ys.data(), 5);
  EXPECT_EQ(buffer.size(), 3);
  EXPECT_EQ(buffer.added(), 5);
  for (int d = 0; d < 20; ++d) {
    buffer.sample(1, 3, d, &x, &y);
    EXPECT_GE(x, 3.0f);
  }
}

}  // namespace
}  // namespace ddp::data
