// Device discovery never throws, and says why when there is no GPU; CPU streams and events behave as
// synchronous no-ops so the same code serves both devices; the current stream is per thread and follows the
// guards alive on it.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace ddp {
namespace {

TEST(Device, DiscoveryDoesNotThrowAndExplainsAbsence) {
  const CudaAvailability& a = cuda_availability();
  EXPECT_GE(a.device_count, 0);
  if (a.device_count == 0) {
    EXPECT_FALSE(a.reason.empty());
    EXPECT_NE(a.reason.find("no usable CUDA device"), std::string::npos) << a.reason;
  } else {
    EXPECT_TRUE(a.reason.empty()) << a.reason;
  }
  EXPECT_EQ(cuda_device_count(), a.device_count);
}

TEST(Device, Names) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(Device::cuda(1), Device::cuda(1));
  EXPECT_NE(Device::cuda(1), Device::cpu());
}

TEST(Stream, CpuStreamAndEventAreSynchronous) {
  Stream s;  // CPU
  EXPECT_TRUE(s.device().is_cpu());
  EXPECT_EQ(s.handle(), nullptr);
  Event e = Event::create(Device::cpu());
  e.record(s);
  EXPECT_TRUE(e.query());
  e.wait(s);
  e.synchronize();
  s.synchronize();
}

TEST(Stream, MoveTransfersOwnership) {
  Stream a = Stream::create(Device::cpu());
  Stream b = std::move(a);
  EXPECT_TRUE(b.device().is_cpu());
  Event e1 = Event::create(Device::cpu());
  Event e2 = std::move(e1);
  EXPECT_TRUE(e2.query());
}

TEST(CpuCompletion, WaitReturnsAfterSignalFromAnotherThread) {
  CpuCompletion c;
  c.reset();
  EXPECT_FALSE(c.done());
  std::thread t([&] { c.signal(); });
  c.wait();
  t.join();
  EXPECT_TRUE(c.done());
}

TEST(CurrentStream, IsTheCpuStreamWhenNoGuardIsAlive) {
  EXPECT_EQ(&current_stream(), &cpu_stream());
  EXPECT_TRUE(current_stream().device().is_cpu());
}

TEST(CurrentStream, IsTheNewestGuardsStreamAndComesBackWhenItEnds) {
  Stream outer_stream, inner_stream;
  {
    StreamGuard outer(outer_stream);
    EXPECT_EQ(&current_stream(), &outer_stream);
    {
      StreamGuard inner(inner_stream);
      EXPECT_EQ(&current_stream(), &inner_stream);
    }
    EXPECT_EQ(&current_stream(), &outer_stream);
  }
  EXPECT_EQ(&current_stream(), &cpu_stream());
}

TEST(CurrentStream, GuardsEndingOutOfOrderNeverLeaveAnEndedOneCurrent) {
  Stream a_stream, b_stream;
  auto a = std::make_unique<StreamGuard>(a_stream);  // as a Session made first and destroyed first
  auto b = std::make_unique<StreamGuard>(b_stream);
  a.reset();
  EXPECT_EQ(&current_stream(), &b_stream);
  b.reset();
  EXPECT_EQ(&current_stream(), &cpu_stream());
}

TEST(CurrentStream, IsPerThread) {
  Stream mine;
  StreamGuard guard(mine);
  const Stream* other_thread = nullptr;
  std::thread([&] { other_thread = &current_stream(); }).join();
  EXPECT_EQ(other_thread, &cpu_stream());
  EXPECT_EQ(&current_stream(), &mine);
}

}  // namespace
}  // namespace ddp
