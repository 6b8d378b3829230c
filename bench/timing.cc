#include "bench/timing.h"

#include <algorithm>
#include <chrono>

namespace ddp::bench {

double time_per_call_us(const std::function<void()>& work, int calls, const Stream& stream) {
  if (stream.device().is_cuda()) {
    Event begin = Event::create(stream.device(), true), end = Event::create(stream.device(), true);
    begin.record(stream);
    for (int i = 0; i < calls; ++i) work();
    end.record(stream);
    end.synchronize();
    return static_cast<double>(end.elapsed_ms_since(begin)) * 1000.0 / calls;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) work();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace ddp::bench
