// A timeline of the run in Chrome's trace-event format, which Perfetto (ui.perfetto.dev) and chrome://tracing
// open: {"traceEvents": [...], "displayTimeUnit": "ms"}.
//
// Each rank is a process (pid = rank) and each kind of work a named track (tid), e.g. "compute" and "comm", so
// overlap of communication with backward is visible at a glance. Spans are complete events ("ph": "X") with ts
// and dur in microseconds. Recording only appends to an in-memory buffer under a mutex (cheap enough for a few
// events per bucket per step); the file is written once, atomically, at the end. The buffer is capped so a long
// run cannot exhaust memory; events past the cap are counted and the count is written in the file's metadata.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddp {
namespace io {

class TraceRecorder {
 public:
  // `pid` is the rank; `process_name` labels it (default "rank N").
  explicit TraceRecorder(int pid, std::string process_name = "", size_t max_events = 1000000);

  // The id of the track called `name`, created (with its thread_name metadata event) on first use.
  int track(const std::string& name);

  // Microseconds since the recorder was made (steady clock).
  double now_us() const;

  // A span on a track, times in microseconds of now_us(). `args` must be a JSON object or null.
  void complete(int track, const std::string& name, const std::string& category, double ts_us, double dur_us,
                const nlohmann::json& args = nullptr);

  // Records a span from construction to destruction.
  class Span {
   public:
    Span(TraceRecorder* recorder, int track, std::string name, std::string category,
         nlohmann::json args = nullptr);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    TraceRecorder* recorder_;
    int track_;
    std::string name_;
    std::string category_;
    nlohmann::json args_;
    double start_us_;
  };

  size_t event_count() const;
  size_t dropped_events() const;
  // The whole trace document.
  nlohmann::json to_json() const;
  // Writes to_json() to `path` atomically.
  void write(const std::string& path) const;

 private:
  int pid_;
  std::string process_name_;
  size_t max_events_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mutex_;
  std::vector<std::string> tracks_;
  std::vector<nlohmann::json> events_;
  size_t dropped_ = 0;
};

}  // namespace io
}  // namespace ddp
