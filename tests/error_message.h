// What a user reads when a call refuses its input: tests of bad input compare the message, not only the type.
#pragma once

#include <functional>
#include <string>

namespace ddp::testing {

// The message of the `Error` that `f` throws, or "(no error)"; an exception of another type goes through.
template <typename Error>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ddp::testing
