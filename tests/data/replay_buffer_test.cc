// The replay buffer against a reference: what it holds is exactly the newest `capacity` samples added, a batch
// draws only from those, the same (seed, draw) gives the same batch, and its memory never grows. Samples that are
// not finite are refused (naming the first) or skipped and counted.
#include "runtime/data/replay_buffer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "runtime/core/check.h"
#include "tests/error_message.h"

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

TEST(ReplayBuffer, RefusesSamplesThatAreNotFiniteNamingTheFirst) {
  ReplayBuffer buffer(8, 2, 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0, 1, 2, nan, 4, 5}, y = {0, 1, std::numeric_limits<float>::infinity()};
  const std::string message = testing::error_message<InvalidArgument>([&] { buffer.add(rows(x, 2), rows(y, 1)); });
  EXPECT_NE(message.find("x row 1, column 1 (counting from 0; in Fortran x(2, 2)) is NaN or infinite"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("skip"), std::string::npos) << message;
  EXPECT_EQ(buffer.size(), 0);  // nothing of a refused call is added
  EXPECT_EQ(buffer.added(), 0);
  x[3] = 3;
  const std::string in_y = testing::error_message<InvalidArgument>([&] { buffer.add(rows(x, 2), rows(y, 1)); });
  EXPECT_NE(in_y.find("y row 2, column 0"), std::string::npos) << in_y;
}

TEST(ReplayBuffer, SkipsSamplesThatAreNotFiniteAndCountsThem) {
  ReplayBuffer buffer(8, 2, 1);
  buffer.set_nonfinite(NonFinitePolicy::kSkip);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Samples 0..3 are (i, -i) -> 10 i; sample 1 has a NaN input, sample 3 an infinite target.
  std::vector<float> x = {0, 0, 1, nan, 2, -2, 3, -3}, y = {0, 10, 20, -std::numeric_limits<float>::infinity()};
  buffer.add(rows(x, 2), rows(y, 1));
  EXPECT_EQ(buffer.size(), 2);
  EXPECT_EQ(buffer.added(), 2);
  EXPECT_EQ(buffer.skipped(), 2);
  std::vector<float> bx(2 * 32), by(32);
  buffer.sample(3, 0, rows(bx, 2), rows(by, 1));
  for (int i = 0; i < 32; ++i) {
    EXPECT_TRUE(bx[2 * i] == 0 || bx[2 * i] == 2) << bx[2 * i];
    EXPECT_EQ(by[i], 10 * bx[2 * i]);
    EXPECT_TRUE(std::isfinite(bx[2 * i + 1]));
  }
  std::vector<float> all_bad_x = {nan, 0}, all_bad_y = {1};
  buffer.add(rows(all_bad_x, 2), rows(all_bad_y, 1));
  EXPECT_EQ(buffer.size(), 2);
  EXPECT_EQ(buffer.skipped(), 3);
}

}  // namespace
}  // namespace ddp::data
