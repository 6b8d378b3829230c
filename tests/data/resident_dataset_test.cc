// ResidentDataset on the CPU: every batch of an epoch, gathered by position from the uploaded order, holds
// exactly the bytes of BatchLoader's batch for the same sampler (so the main job's switch to it changes no
// sample and no order); bad orders and bad batch tensors are refused by name. The GPU copy of this check is in
// tests/gpu/tensor_ops_gpu_test.cc.
#include "runtime/data/resident_dataset.h"

#include <gtest/gtest.h>

#include <string>

#include "runtime/core/check.h"
#include "runtime/data/loader.h"
#include "tests/data/toy_dataset.h"

namespace ddp {
namespace data {
namespace {

using testing::toy;

TEST(ResidentDataset, BatchesAreTheLoadersBatches) {
  const Dataset d = toy(103, 3);
  SamplerOptions so;
  so.dataset_size = d.size;
  so.num_replicas = 2;
  so.rank = 1;
  so.seed = 9;
  LoaderOptions lo;
  lo.batch_size = 10;
  BatchLoader loader(view(d), DistributedSampler(so), lo);
  DistributedSampler sampler(so);
  ResidentDataset resident(view(d), Device::cpu(), cpu_stream());
  Tensor x = Tensor::empty({10, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
  Tensor y = Tensor::empty({10}, DType::kInt32, Device::cpu(), cpu_stream());
  for (int64_t epoch : {0, 3}) {
    loader.start_epoch(epoch);
    sampler.set_epoch(epoch);
    resident.set_order(sampler.indices(), cpu_stream());
    ASSERT_EQ(resident.order_size(), 52);  // 103 padded to 104 over 2 ranks
    int64_t begin = 0;
    Tensor next_x = Tensor::empty({10, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor next_y = Tensor::empty({10}, DType::kInt32, Device::cpu(), cpu_stream());
    while (const Batch* b = loader.next()) {
      Tensor bx = x.slice_rows(0, b->size), by = y.slice_rows(0, b->size);
      resident.gather(begin, bx, by, cpu_stream());
      const std::vector<float> got_x = bx.to_vector<float>(cpu_stream());
      const std::vector<std::int32_t> got_y = by.to_vector<std::int32_t>(cpu_stream());
      EXPECT_EQ(got_x, std::vector<float>(b->features, b->features + b->size * 3)) << "epoch " << epoch;
      EXPECT_EQ(got_y, std::vector<std::int32_t>(b->labels, b->labels + b->size)) << "epoch " << epoch;
      // The same batch from the cursor (the way a captured step reads it).
      Tensor nx = next_x.slice_rows(0, b->size), ny = next_y.slice_rows(0, b->size);
      resident.gather_next(nx, ny, cpu_stream());
      EXPECT_EQ(nx.to_vector<float>(cpu_stream()), got_x) << "epoch " << epoch << " from the cursor";
      EXPECT_EQ(ny.to_vector<std::int32_t>(cpu_stream()), got_y) << "epoch " << epoch << " from the cursor";
      begin += b->size;
      EXPECT_EQ(resident.cursor(), begin);
    }
    EXPECT_EQ(begin, 52);
  }
}

TEST(ResidentDataset, RefusesRowsOutsideTheDataSetAndMisshapenBatches) {
  const Dataset d = toy(20, 3);
  ResidentDataset resident(view(d), Device::cpu(), cpu_stream());
  try {
    resident.set_order({0, 5, 20}, cpu_stream());
    FAIL() << "accepted row 20 of 20";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("position 2 names row 20 of a data set of 20 rows"), std::string::npos)
        << e.what();
  }
  resident.set_order({3, 4, 5}, cpu_stream());
  Tensor x = Tensor::empty({2, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
  Tensor y = Tensor::empty({2}, DType::kInt32, Device::cpu(), cpu_stream());
  EXPECT_THROW(resident.gather(2, x, y, cpu_stream()), Error);  // rows [2, 4) of 3
  Tensor wide = Tensor::empty({2, 4}, DType::kFloat32, Device::cpu(), cpu_stream());
  EXPECT_THROW(resident.gather(0, wide, y, cpu_stream()), Error);
  resident.gather(1, x, y, cpu_stream());
  EXPECT_EQ(x.to_vector<float>(cpu_stream()), (std::vector<float>{4, 4.5f, -4, 5, 5.5f, -5}));
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{4, 5}));
}

TEST(ResidentDataset, TheCursorStartsWhereItIsSetAndStopsAtTheEndOfTheOrder) {
  const Dataset d = toy(20, 3);
  ResidentDataset resident(view(d), Device::cpu(), cpu_stream());
  resident.set_order({3, 4, 5, 6}, cpu_stream());
  Tensor x = Tensor::empty({2, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
  Tensor y = Tensor::empty({2}, DType::kInt32, Device::cpu(), cpu_stream());
  resident.set_cursor(1, cpu_stream());  // a resume one sample into the epoch
  resident.gather_next(x, y, cpu_stream());
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{4, 5}));
  EXPECT_THROW(resident.gather_next(x, y, cpu_stream()), InvalidArgument);  // rows [3, 5) of 4
  EXPECT_EQ(resident.cursor(), 3);
  EXPECT_THROW(resident.set_cursor(5, cpu_stream()), InvalidArgument);
  resident.set_order({7, 8}, cpu_stream());  // a new epoch starts at 0
  resident.gather_next(x, y, cpu_stream());
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{7, 8}));
}

// A prefetch gathers the batch after the current one, and only while it ends within the order: past the end
// neither the rows nor the cursor move, and take_prefetched says so, so the step gathers its own batch.
TEST(ResidentDataset, APrefetchTakesTheNextBatchOnlyWithinTheOrder) {
  const Dataset d = toy(20, 3);
  ResidentDataset resident(view(d), Device::cpu(), cpu_stream());
  resident.set_order({3, 4, 5, 6, 7}, cpu_stream());
  Tensor x = Tensor::empty({2, 3}, DType::kFloat32, Device::cpu(), cpu_stream());
  Tensor y = Tensor::empty({2}, DType::kInt32, Device::cpu(), cpu_stream());
  resident.gather_next(x, y, cpu_stream());
  EXPECT_FALSE(resident.take_prefetched(2));
  resident.prefetch_next(x, y, cpu_stream());
  resident.join_prefetch(cpu_stream());
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(resident.cursor(), 4);
  EXPECT_FALSE(resident.take_prefetched(1));  // a batch of another size is not the one prefetched
  resident.prefetch_next(x, y, cpu_stream());  // rows [4, 6) of 5: not gathered
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{5, 6}));
  EXPECT_EQ(resident.cursor(), 4);
  EXPECT_FALSE(resident.take_prefetched(2));
  Tensor last_x = x.slice_rows(0, 1), last_y = y.slice_rows(0, 1);
  resident.gather_next(last_x, last_y, cpu_stream());  // the epoch's shorter last batch
  EXPECT_EQ(last_y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{7}));
  resident.set_order({8, 9, 10}, cpu_stream());
  resident.prefetch_next(x, y, cpu_stream());
  EXPECT_TRUE(resident.take_prefetched(2));
  EXPECT_FALSE(resident.take_prefetched(2));  // once
  EXPECT_EQ(y.to_vector<std::int32_t>(cpu_stream()), (std::vector<std::int32_t>{8, 9}));
  resident.prefetch_next(last_x, last_y, cpu_stream());
  resident.set_cursor(0, cpu_stream());  // a resume: what was prefetched is not the batch at the new place
  EXPECT_FALSE(resident.take_prefetched(1));
}

}  // namespace
}  // namespace data
}  // namespace ddp
