// Metrics (JSON lines) and traces (Chrome trace events) parse back with nlohmann and have the promised shape.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"
#include "runtime/io/metrics.h"
#include "runtime/io/trace.h"
#include "tests/scratch.h"

namespace ddp {
namespace io {
namespace {

using nlohmann::json;

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(Metrics, OneObjectPerLineFlushedAsWritten) {
  const std::string path = ddp::testing::scratch_path("metrics.jsonl");
  {
    MetricsWriter w(path);
    w.write({{"step", 1}, {"epoch", 0}, {"loss", 2.3}, {"samples_per_s", 1000.5}});
    // Visible before the writer closes: a crash loses nothing already written.
    EXPECT_EQ(read_lines(path).size(), 1u);
    w.write({{"epoch", 0}, {"test_loss", 0.4}, {"test_accuracy", 0.88}, {"nan", std::nan("")}});
  }
  {
    MetricsWriter w(path, /*append=*/true);
    w.write({{"step", 2}, {"loss", 2.0}});
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["loss"].get<double>(), 2.3);
  EXPECT_DOUBLE_EQ(lines[1]["test_accuracy"].get<double>(), 0.88);
  EXPECT_TRUE(lines[1]["nan"].is_null());
  EXPECT_EQ(lines[2]["step"], 2);
  MetricsWriter w(path);
  EXPECT_THROW(w.write(json::array({1, 2})), InvalidArgument);
  EXPECT_THROW(MetricsWriter("/nonexistent-dir-ddp/m.jsonl"), InvalidArgument);
}

// A full disk under the metrics file, made by a file size limit (RLIMIT_FSIZE: writes past it fail as they
// would with ENOSPC, the one that crosses it partway through).
TEST(Metrics, AFailedWriteIsReportedOnceAndLeavesOnlyWholeLines) {
  const std::string path = ddp::testing::scratch_path("metrics_full.jsonl");
  std::string warnings;
  {
    MetricsWriter w(path);
    ddp::testing::FileSizeLimit limit(1000);  // above the warning's length: stderr's capture is a file too
    ::testing::internal::CaptureStderr();
    for (int step = 1; step <= 40; ++step) {
      EXPECT_NO_THROW(w.write({{"step", step}, {"loss", 2.5}, {"samples_per_s", 1000.25}}));
    }
    warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(w.failure(), "File too large");
  }
  const std::string bytes = read_file(path);
  ASSERT_FALSE(bytes.empty());
  EXPECT_LE(bytes.size(), 1000u);
  EXPECT_EQ(bytes.back(), '\n') << "a truncated last line: " << bytes;
  const auto lines = read_lines(path);
  ASSERT_GE(lines.size(), 2u);
  for (std::size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["step"], static_cast<int>(i) + 1);
  EXPECT_EQ(warnings, "ddp: warning: writing metrics file " + path + " failed: File too large; it keeps the "
                      "records written before and takes no more in this run (training and checkpoints go on); free "
                      "space on its disk or give another path\n");
}

TEST(Metrics, ThreadSafeLines) {
  const std::string path = ddp::testing::scratch_path("metrics-threads.jsonl");
  {
    MetricsWriter w(path);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&w, t] {
        for (int i = 0; i < 200; ++i) w.write({{"thread", t}, {"i", i}, {"pad", std::string(100, 'x')}});
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(read_lines(path).size(), 800u);  // every line parses: none interleaved
}

TEST(Trace, ChromeTraceEventFormat) {
  TraceRecorder trace(/*pid=*/3);
  const int compute = trace.track("compute");
  const int comm = trace.track("comm");
  EXPECT_EQ(trace.track("compute"), compute);
  trace.complete(compute, "backward", "step", 10.0, 250.5, {{"step", 7}});
  trace.complete(comm, "allreduce bucket 0", "nccl", 100.0, 80.0, {{"bytes", 1 << 20}});
  {
    TraceRecorder::Span span(&trace, compute, "optimizer", "step");
  }
  const std::string path = ddp::testing::scratch_path("trace.json");
  trace.write(path);
  const json doc = json::parse(read_file(path));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  int threads = 0, completes = 0;
  bool named_process = false;
  for (const json& e : doc["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      ++threads;
      EXPECT_EQ(e["args"]["name"], e["tid"] == compute ? "compute" : "comm");
    }
    if (e["ph"] == "M" && e["name"] == "process_name") named_process = e["args"]["name"] == "rank 3";
    if (e["ph"] == "X") {
      ++completes;
      EXPECT_TRUE(e["ts"].is_number());
      EXPECT_TRUE(e["dur"].is_number());
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      EXPECT_TRUE(e.contains("cat"));
      if (e["name"] == "backward") {
        EXPECT_EQ(e["tid"], compute);
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 250.5);
        EXPECT_EQ(e["args"]["step"], 7);
      }
      if (e["name"] == "allreduce bucket 0") {
        EXPECT_EQ(e["tid"], comm);
      }
    }
  }
  EXPECT_EQ(threads, 2);
  EXPECT_EQ(completes, 3);
  EXPECT_TRUE(named_process);
}

TEST(Trace, ThreadSafeAndBounded) {
  TraceRecorder trace(0, "rank 0", /*max_events=*/1000);
  const int track = trace.track("compute");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) trace.complete(track, "op", "x", trace.now_us(), 1.0);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(trace.event_count(), 1000u);
  EXPECT_EQ(trace.dropped_events(), 1000u);
  EXPECT_EQ(trace.to_json()["otherData"]["dropped_events"], 1000);
  EXPECT_THROW(trace.complete(99, "bad", "x", 0, 1), InvalidArgument);
}

}  // namespace
}  // namespace io
}  // namespace ddp
