// Every collective of the ProcessGroup, on the world's device and its default backend (DDP_BACKEND overrides:
// the GPU bundle runs this binary with NCCL at one rank and with MPI for 4 ranks sharing one GPU), against
// values computed here. Collectives on CUDA buffers must wait for work queued on the caller's stream: the
// ordering test queues a long chain before the buffer's final write, so a missing wait gives a wrong sum.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/core/bfloat16.h"
#include "runtime/distributed/process_group_mpi.h"
#include "runtime/core/check.h"
#include "runtime/core/settings.h"
#include "runtime/distributed/process_group.h"
#include "tests/distributed/rank_fixture.h"
#include "tests/distributed/test_world.h"

namespace ddp {
namespace {

using ddp::testing::test_world;

// A buffer on the world's device with host upload/download.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(const Device& device, std::size_t n) : device_(device), n_(n) {
    if (device.is_cuda()) {
      DDP_CUDA_CHECK(cudaMalloc(&data_, n * sizeof(T)));
    } else {
      host_.resize(n);
      data_ = host_.data();
    }
  }
  ~DeviceBuffer() {
    if (device_.is_cuda()) cudaFree(data_);
  }
  void upload(const std::vector<T>& v, const Stream& s) {
    if (device_.is_cuda()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(data_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, s.handle()));
    } else {
      host_ = v;
      data_ = host_.data();
    }
  }
  std::vector<T> download(const Stream& s) {
    std::vector<T> v(n_);
    if (device_.is_cuda()) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(v.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s.handle()));
      s.synchronize();
    } else {
      v = host_;
    }
    return v;
  }
  CommBuffer comm(DType t) const { return CommBuffer{data_, static_cast<std::int64_t>(n_), t, device_}; }

 private:
  Device device_;
  std::size_t n_;
  std::vector<T> host_;
  T* data_ = nullptr;
};

using ProcessGroupTest = ddp::testing::RankTest;

TEST_F(ProcessGroupTest, DescribesTheWorld) {
  EXPECT_EQ(group_->rank(), test_world().rank());
  EXPECT_EQ(group_->size(), test_world().size());
  EXPECT_EQ(group_->backend(), default_backend(device_));
}

TEST_F(ProcessGroupTest, AllReduceSumAverageMaxFloat32) {
  const std::size_t n = 100003;  // odd, not a multiple of any vector width
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 97) + 0.25f * rank_;
    DeviceBuffer<float> buf(device_, n);
    buf.upload(v, stream_);
    auto work = group_->all_reduce(buf.comm(DType::kFloat32), op, stream_);
    work->wait(stream_);
    const std::vector<float> got = buf.download(stream_);
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(work->exception(), nullptr);
    const float rank_sum = 0.25f * size_ * (size_ - 1) / 2.0f;
    for (std::size_t i = 0; i < n; i += 1009) {
      const float base = static_cast<float>(i % 97);
      const float expected = op == ReduceOp::kSum       ? size_ * base + rank_sum
                             : op == ReduceOp::kAverage ? base + rank_sum / size_
                                                        : base + 0.25f * (size_ - 1);
      ASSERT_NEAR(got[i], expected, 1e-5f * (1.0f + std::abs(expected))) << "op " << static_cast<int>(op) << " i " << i;
    }
  }
}

TEST_F(ProcessGroupTest, AllReduceBFloat16AndInt64) {
  // Small integers are exact in bfloat16.
  const std::size_t n = 4099;
  std::vector<std::uint16_t> v(n, static_cast<std::uint16_t>(0x3f80));  // 1.0 in bfloat16
  DeviceBuffer<std::uint16_t> b(device_, n);
  b.upload(v, stream_);
  group_->all_reduce(b.comm(DType::kBFloat16), ReduceOp::kSum, stream_)->wait(stream_);
  const std::vector<std::uint16_t> got = b.download(stream_);
  float f;
  const std::uint32_t bits = static_cast<std::uint32_t>(got[n - 1]) << 16;
  std::memcpy(&f, &bits, 4);
  EXPECT_EQ(f, static_cast<float>(size_));

  std::vector<std::int64_t> w(17, (std::int64_t{1} << 40) + rank_);
  DeviceBuffer<std::int64_t> c(device_, w.size());
  c.upload(w, stream_);
  group_->all_reduce(c.comm(DType::kInt64), ReduceOp::kSum, stream_)->wait(stream_);
  EXPECT_EQ(c.download(stream_)[16], size_ * (std::int64_t{1} << 40) + size_ * (size_ - 1) / 2);

  // The smallest and the largest of every rank's value (a veto word: INT64_MAX where a rank has none).
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<std::int64_t> words(3, INT64_MAX);
    words[1] = 5 * size_ - rank_;
    DeviceBuffer<std::int64_t> d(device_, words.size());
    d.upload(words, stream_);
    group_->all_reduce(d.comm(DType::kInt64), op, stream_)->wait(stream_);
    const std::vector<std::int64_t> got = d.download(stream_);
    EXPECT_EQ(got[0], INT64_MAX);
    EXPECT_EQ(got[1], op == ReduceOp::kMin ? 4 * size_ + 1 : 5 * size_);
  }
}

// Averages in every type, against the host's own arithmetic: on a CUDA-aware MPI (or its test seam,
// DDP_MPI_SIMULATE_CUDA_AWARE=1, which tools/gpu_jobs.txt runs) the division is a device kernel, elsewhere the
// host's; both must give the bits of bf16(float(sum) / size) and sum / size.
TEST_F(ProcessGroupTest, AveragesOfEveryTypeAreTheSumDividedByTheWorldSize) {
  if (settings::flag(settings::setting("DDP_MPI_SIMULATE_CUDA_AWARE")) && device_.is_cuda() &&
      group_->backend() == Backend::kMpi) {
    EXPECT_TRUE(static_cast<ProcessGroupMpi&>(*group_).cuda_aware());
  }
  const std::size_t n = 1031;
  std::vector<std::uint16_t> h(n);
  std::vector<std::int32_t> i32(n);
  for (std::size_t i = 0; i < n; ++i) {
    h[i] = float_to_bf16(static_cast<float>(3 * (i % 13) + rank_));  // small integers: every sum is exact
    i32[i] = static_cast<std::int32_t>(i * 3 + 7 * rank_);
  }
  DeviceBuffer<std::uint16_t> b(device_, n);
  DeviceBuffer<std::int32_t> c(device_, n);
  b.upload(h, stream_);
  c.upload(i32, stream_);
  group_->all_reduce(b.comm(DType::kBFloat16), ReduceOp::kAverage, stream_)->wait(stream_);
  group_->all_reduce(c.comm(DType::kInt32), ReduceOp::kAverage, stream_)->wait(stream_);
  const std::vector<std::uint16_t> got_b = b.download(stream_);
  const std::vector<std::int32_t> got_c = c.download(stream_);
  for (std::size_t i = 0; i < n; i += 7) {
    // Exact sums in any reduction order, so the division alone decides the bits.
    float sum = 0;
    std::int64_t isum = 0;
    for (int r = 0; r < size_; ++r) {
      sum += static_cast<float>(3 * (i % 13) + r);
      isum += static_cast<std::int64_t>(i * 3 + 7 * r);
    }
    ASSERT_EQ(got_b[i], float_to_bf16(sum / static_cast<float>(size_))) << "bfloat16 element " << i;
    ASSERT_EQ(got_c[i], static_cast<std::int32_t>(isum / size_)) << "int32 element " << i;
  }
}

TEST_F(ProcessGroupTest, BroadcastFromLastRank) {
  const int root = size_ - 1;
  std::vector<float> v(1000, static_cast<float>(rank_ + 1));
  DeviceBuffer<float> b(device_, v.size());
  b.upload(v, stream_);
  group_->broadcast(b.comm(DType::kFloat32), root, stream_)->wait(stream_);
  for (float x : b.download(stream_)) ASSERT_EQ(x, static_cast<float>(root + 1));
}

TEST_F(ProcessGroupTest, AllGatherPlacesRankRAtOffsetR) {
  const std::size_t n = 333;
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = rank_ * 1000 + static_cast<int>(i);
  DeviceBuffer<std::int32_t> in(device_, n);
  DeviceBuffer<std::int32_t> out(device_, n * size_);
  in.upload(v, stream_);
  group_->all_gather(in.comm(DType::kInt32), out.comm(DType::kInt32), stream_)->wait(stream_);
  const auto got = out.download(stream_);
  for (int r = 0; r < size_; ++r) {
    for (std::size_t i = 0; i < n; i += 37) ASSERT_EQ(got[r * n + i], r * 1000 + static_cast<int>(i));
  }
}

TEST_F(ProcessGroupTest, ReduceScatterGivesRankItsReducedSlice) {
  const std::size_t n = 257;
  std::vector<float> v(n * size_);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + rank_;
  DeviceBuffer<float> in(device_, v.size());
  DeviceBuffer<float> out(device_, n);
  in.upload(v, stream_);
  group_->reduce_scatter(in.comm(DType::kFloat32), out.comm(DType::kFloat32), ReduceOp::kSum, stream_)
      ->wait(stream_);
  const auto got = out.download(stream_);
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = size_ * static_cast<float>(rank_ * n + i) + size_ * (size_ - 1) / 2.0f;
    ASSERT_EQ(got[i], expected) << i;
  }
}

// The sharded optimizer's form: each rank's slice of one padded buffer is the output (reduce-scatter) or the
// input (all-gather) in place, as NCCL allows and MPI needs MPI_IN_PLACE for.
TEST_F(ProcessGroupTest, ReduceScatterAndAllGatherInPlaceOnRankSlices) {
  const std::size_t n = 257;  // odd: no vector width divides a slice
  std::vector<float> v(n * size_);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000) + rank_;
  DeviceBuffer<float> buf(device_, v.size());
  buf.upload(v, stream_);
  CommBuffer whole = buf.comm(DType::kFloat32);
  CommBuffer mine = whole;
  mine.data = static_cast<float*>(whole.data) + rank_ * n;
  mine.count = static_cast<std::int64_t>(n);
  group_->reduce_scatter(whole, mine, ReduceOp::kAverage, stream_)->wait(stream_);
  std::vector<float> got = buf.download(stream_);
  for (std::size_t i = 0; i < n; ++i) {
    const float sum = size_ * static_cast<float>((rank_ * n + i) % 1000) + size_ * (size_ - 1) / 2.0f;
    ASSERT_EQ(got[rank_ * n + i], sum * (1.0f / size_)) << "reduce_scatter element " << i;
  }
  // Every rank then writes its own slice and gathers the others' into place.
  for (std::size_t i = 0; i < n; ++i) got[rank_ * n + i] = static_cast<float>(rank_ * 10000 + i);
  buf.upload(got, stream_);
  group_->all_gather(mine, whole, stream_)->wait(stream_);
  got = buf.download(stream_);
  for (int r = 0; r < size_; ++r) {
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[r * n + i], static_cast<float>(r * 10000 + i)) << r << " " << i;
  }
}

TEST_F(ProcessGroupTest, BuffersThatOverlapOtherwiseThanAsARankSliceAreRefused) {
  const std::size_t n = 16;
  DeviceBuffer<float> buf(device_, n * size_ + 1);
  CommBuffer whole = buf.comm(DType::kFloat32);
  whole.count = static_cast<std::int64_t>(n * size_);
  CommBuffer shifted = whole;
  shifted.data = static_cast<float*>(whole.data) + rank_ * n + 1;
  shifted.count = static_cast<std::int64_t>(n);
  EXPECT_THROW(group_->reduce_scatter(whole, shifted, ReduceOp::kSum, stream_), InvalidArgument);
  EXPECT_THROW(group_->all_gather(shifted, whole, stream_), InvalidArgument);
}

TEST_F(ProcessGroupTest, ManyCollectivesCompleteInIssueOrder) {
  std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 16; ++k) {
    bufs.push_back(std::make_unique<DeviceBuffer<float>>(device_, 1 << 12));
    bufs.back()->upload(std::vector<float>(1 << 12, static_cast<float>(k)), stream_);
    works.push_back(group_->all_reduce(bufs.back()->comm(DType::kFloat32), ReduceOp::kSum, stream_));
  }
  for (auto& w : works) w->synchronize();
  for (int k = 0; k < 16; ++k) {
    EXPECT_TRUE(works[k]->is_completed());
    EXPECT_GE(works[k]->duration_ms(), 0.0);
    EXPECT_EQ(bufs[k]->download(stream_)[7], static_cast<float>(k * size_));
  }
  EXPECT_NO_THROW(group_->barrier());
}

TEST_F(ProcessGroupTest, CollectiveWaitsForWorkQueuedOnTheCallersStream) {
  if (!device_.is_cuda()) GTEST_SKIP() << "ordering against a device stream needs a GPU";
  const std::size_t big = 256 << 20;
  char* busy = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&busy, big));
  DeviceBuffer<float> b(device_, 1 << 20);
  b.upload(std::vector<float>(1 << 20, 0.0f), stream_);
  // ~10 ms of memsets, then the real value: a collective that does not wait would reduce zeros.
  for (int i = 0; i < 40; ++i) DDP_CUDA_CHECK(cudaMemsetAsync(busy, i, big, stream_.handle()));
  b.upload(std::vector<float>(1 << 20, 1.0f), stream_);
  group_->all_reduce(b.comm(DType::kFloat32), ReduceOp::kSum, stream_)->wait(stream_);
  const auto got = b.download(stream_);
  EXPECT_EQ(got[0], static_cast<float>(size_));
  EXPECT_EQ(got.back(), static_cast<float>(size_));
  DDP_CUDA_CHECK(cudaFree(busy));
}

// Each rank sends its own block to the next rank of a ring and receives the previous one's, while also
// exchanging a second pair with both neighbours, listed in an order that would deadlock as blocking calls.
// With 2 ranks both neighbours are the same rank, so the two buffers to it must match in the order listed.
TEST_F(ProcessGroupTest, SendRecvExchangesWithNeighboursInListedOrder) {
  const std::size_t n = 10007;
  const int next = (rank_ + 1) % size_, previous = (rank_ + size_ - 1) % size_;
  auto block = [&](int from, int which) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(from * 1000 + which * 100) + static_cast<float>(i % 91);
    return v;
  };
  DeviceBuffer<float> to_next(device_, n), to_previous(device_, n), from_previous(device_, n), from_next(device_, n);
  to_next.upload(block(rank_, 0), stream_);
  to_previous.upload(block(rank_, 1), stream_);
  auto work = group_->send_recv({{to_next.comm(DType::kFloat32), next}, {to_previous.comm(DType::kFloat32), previous}},
                             {{from_previous.comm(DType::kFloat32), previous}, {from_next.comm(DType::kFloat32), next}},
                             stream_);
  work->wait(stream_);
  EXPECT_EQ(work->exception(), nullptr);
  EXPECT_EQ(from_previous.download(stream_), block(previous, 0));
  EXPECT_EQ(from_next.download(stream_), block(next, 1));

  // Single transfers of another type, around the ring (not to oneself: NCCL pairs a send to oneself only with a
  // receive of the same group).
  if (size_ == 1) return;
  std::vector<std::int64_t> mine(33, (std::int64_t{1} << 40) + rank_);
  DeviceBuffer<std::int64_t> out(device_, mine.size()), in(device_, mine.size());
  out.upload(mine, stream_);
  if (rank_ % 2 == 0) {  // even ranks send first, odd ranks receive first: each call completes on its own
    group_->send(out.comm(DType::kInt64), next, stream_)->wait(stream_);
    group_->recv(in.comm(DType::kInt64), previous, stream_)->wait(stream_);
  } else {
    group_->recv(in.comm(DType::kInt64), previous, stream_)->wait(stream_);
    group_->send(out.comm(DType::kInt64), next, stream_)->wait(stream_);
  }
  EXPECT_EQ(in.download(stream_)[32], (std::int64_t{1} << 40) + previous);
}

TEST_F(ProcessGroupTest, SendRecvWaitsForWorkQueuedOnTheCallersStream) {
  if (!device_.is_cuda()) GTEST_SKIP() << "ordering against a device stream needs a GPU";
  const std::size_t big = 256 << 20;
  char* busy = nullptr;
  DDP_CUDA_CHECK(cudaMalloc(&busy, big));
  DeviceBuffer<float> out(device_, 1 << 20), in(device_, 1 << 20);
  out.upload(std::vector<float>(1 << 20, 0.0f), stream_);
  for (int i = 0; i < 40; ++i) DDP_CUDA_CHECK(cudaMemsetAsync(busy, i, big, stream_.handle()));
  out.upload(std::vector<float>(1 << 20, static_cast<float>(rank_ + 1)), stream_);
  const int next = (rank_ + 1) % size_, previous = (rank_ + size_ - 1) % size_;
  group_->send_recv({{out.comm(DType::kFloat32), next}}, {{in.comm(DType::kFloat32), previous}}, stream_)->wait(stream_);
  const auto got = in.download(stream_);
  EXPECT_EQ(got[0], static_cast<float>(previous + 1));
  EXPECT_EQ(got.back(), static_cast<float>(previous + 1));
  DDP_CUDA_CHECK(cudaFree(busy));
}

TEST_F(ProcessGroupTest, BadArgumentsAreRefusedClearly) {
  DeviceBuffer<float> in(device_, 10);
  DeviceBuffer<float> wrong(device_, 10 * size_ + 1);
  EXPECT_THROW(group_->all_gather(in.comm(DType::kFloat32), wrong.comm(DType::kFloat32), stream_),
               InvalidArgument);
  EXPECT_THROW(group_->reduce_scatter(wrong.comm(DType::kFloat32), in.comm(DType::kFloat32), ReduceOp::kSum,
                                   stream_),
               InvalidArgument);
  EXPECT_THROW(group_->broadcast(in.comm(DType::kFloat32), size_, stream_), InvalidArgument);
  EXPECT_THROW(parse_backend("gloo"), InvalidArgument);
  try {
    group_->send(in.comm(DType::kFloat32), size_, stream_);
    FAIL() << "a send to rank " << size_ << " of " << size_ << " was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("peer " + std::to_string(size_) + " is not a rank of this group of " +
                                         std::to_string(size_)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(group_->recv(in.comm(DType::kFloat32), -1, stream_), InvalidArgument);
}

}  // namespace
}  // namespace ddp
