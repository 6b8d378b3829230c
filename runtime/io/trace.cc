// Trace-event buffering and serialisation.
#include "runtime/io/trace.h"

#include "runtime/core/check.h"
#include "runtime/io/atomic_file.h"

namespace ddp {
namespace io {

using nlohmann::json;

TraceRecorder::TraceRecorder(int pid, std::string process_name, size_t max_events)
    : pid_(pid),
      process_name_(process_name.empty() ? "rank " + std::to_string(pid) : std::move(process_name)),
      max_events_(max_events),
      start_(std::chrono::steady_clock::now()) {}

int TraceRecorder::track(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<int>(i);
  }
  tracks_.push_back(name);
  return static_cast<int>(tracks_.size() - 1);
}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
}

void TraceRecorder::complete(int track, const std::string& name, const std::string& category, double ts_us,
                             double dur_us, const json& args) {
  DDP_CHECK(args.is_null() || args.is_object(), "trace event args must be a JSON object");
  json event = {{"ph", "X"}, {"name", name}, {"cat", category}, {"ts", ts_us},
                {"dur", dur_us < 0 ? 0.0 : dur_us}, {"pid", pid_}, {"tid", track}};
  if (args.is_object()) event["args"] = args;
  std::lock_guard<std::mutex> lock(mutex_);
  DDP_CHECK(track >= 0 && static_cast<size_t>(track) < tracks_.size(),
            "trace track " + std::to_string(track) + " was not created with track()");
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

TraceRecorder::Span::Span(TraceRecorder* recorder, int track, std::string name, std::string category, json args)
    : recorder_(recorder),
      track_(track),
      name_(std::move(name)),
      category_(std::move(category)),
      args_(std::move(args)),
      start_us_(recorder ? recorder->now_us() : 0.0) {}

TraceRecorder::Span::~Span() {
  if (recorder_ == nullptr) return;
  try {
    recorder_->complete(track_, name_, category_, start_us_, recorder_->now_us() - start_us_, args_);
  } catch (...) {
    // A trace must never end the run from a destructor.
  }
}

size_t TraceRecorder::event_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

size_t TraceRecorder::dropped_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

json TraceRecorder::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid_}, {"tid", 0},
                    {"args", {{"name", process_name_}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid_}, {"tid", 0},
                    {"args", {{"sort_index", pid_}}}});
  for (size_t i = 0; i < tracks_.size(); ++i) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid_}, {"tid", static_cast<int>(i)},
                      {"args", {{"name", tracks_[i]}}}});
  }
  for (const json& e : events_) events.push_back(e);
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"dropped_events", dropped_}, {"max_events", max_events_}}}};
}

void TraceRecorder::write(const std::string& path) const {
  write_file_atomically(path, to_json().dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace io
}  // namespace ddp
