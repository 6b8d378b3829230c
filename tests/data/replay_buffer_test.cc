// The replay buffer against a reference: what it holds is exactly the newest `capacity` samples added, a batch
// draws only from those, the same (seed, draw) gives the same batch, and its memory never grows.
#include "runtime/data/replay_buffer.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "runtime/core/check.h"

namespace ddp::data {
namespace {

// Host arrays seen as tensors, as an application hands its own.
Tensor rows(std::vector<float>& v, std::int64_t width) {
  return Tensor::from_blob(v.data(), {static_cast<std::int64_t>(v.size()) / width, width}, DType::kFloat32,
                           Device::cpu());
}

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
    buffer.add(rows(x, 2), rows(y, 1));
  }
  EXPECT_EQ(buffer.size(), 4);
  EXPECT_EQ(buffer.added(), 9);
  EXPECT_EQ(buffer.bytes(), bytes);
  std::vector<float> x(2 * 64), y(64);
  buffer.sample(7, 0, rows(x, 2), rows(y, 1));
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
  buffer.sample(7, 0, rows(x2, 2), rows(y2, 1));
  EXPECT_EQ(x, x2);
  buffer.sample(7, 1, rows(x2, 2), rows(y2, 1));
  EXPECT_NE(x, x2);
}

TEST(ReplayBuffer, RefusesEmptyDrawsAndBadSizes) {
  EXPECT_THROW(ReplayBuffer(0, 2, 1), InvalidArgument);
  EXPECT_THROW(ReplayBuffer(3, 0, 1), InvalidArgument);
  ReplayBuffer buffer(3, 1, 1);
  std::vector<float> x = {0}, y = {0};
  EXPECT_THROW(buffer.sample(0, 0, rows(x, 1), rows(y, 1)), InvalidArgument);
  // A batch larger than the buffer keeps its newest samples.
  std::vector<float> xs = {1, 2, 3, 4, 5}, ys = {1, 2, 3, 4, 5};
  buffer.add(rows(xs, 1), rows(ys, 1));
  EXPECT_EQ(buffer.size(), 3);
  EXPECT_EQ(buffer.added(), 5);
  for (int d = 0; d < 20; ++d) {
    buffer.sample(3, d, rows(x, 1), rows(y, 1));
    EXPECT_GE(x[0], 3.0f);
  }
  // Samples of another width, another type or rows that do not pair up are refused, saying what was expected.
  std::vector<float> wide = {1, 2};
  EXPECT_THROW(buffer.add(rows(wide, 2), rows(ys, 1)), InvalidArgument);
  EXPECT_THROW(buffer.add(rows(xs, 1), rows(wide, 1)), InvalidArgument);
  std::vector<std::int32_t> ints = {1};
  const Tensor int_rows = Tensor::from_blob(ints.data(), {1, 1}, DType::kInt32, Device::cpu());
  EXPECT_THROW(buffer.sample(0, 0, int_rows, rows(y, 1)), InvalidArgument);
  EXPECT_EQ(buffer.size(), 3);
}

}  // namespace
}  // namespace ddp::data
