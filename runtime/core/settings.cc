#include "runtime/core/settings.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/check.h"

namespace ddp::settings {
namespace {

std::string raw(const Setting& s) {
  const char* value = std::getenv(std::string(s.name).c_str());
  return value != nullptr ? value : "";
}

// The value in force: the environment's, or the default when unset or empty.
std::string value_of(const Setting& s) {
  std::string value = raw(s);
  return value.empty() ? std::string(s.default_value) : value;
}

[[noreturn]] void refuse(const Setting& s, const std::string& value, const std::string& expected) {
  throw InvalidArgument(std::string(s.name) + "=" + value + ": expected " + expected);
}

std::string choices_text(const Setting& s) {
  std::string text;
  std::string_view rest = s.choices;
  for (;;) {
    const size_t bar = rest.find('|');
    if (!text.empty()) text += bar == std::string_view::npos ? " or " : ", ";
    text += rest.substr(0, bar);
    if (bar == std::string_view::npos) return text;
    rest.remove_prefix(bar + 1);
  }
}

bool is_choice(const Setting& s, const std::string& value) {
  std::string_view rest = s.choices;
  for (;;) {
    const size_t bar = rest.find('|');
    if (rest.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) return false;
    rest.remove_prefix(bar + 1);
  }
}

bool parse_flag(const Setting& s, const std::string& value) {
  if (value == "0" || value == "1") return value == "1";
  refuse(s, value, "0 or 1");
}

std::int64_t parse_integer(const Setting& s, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || end == value.c_str() || *end != '\0' || errno == ERANGE) refuse(s, value, "an integer");
  return n;
}

double parse_seconds(const Setting& s, const std::string& value) {
  const char* begin = value.c_str();
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(begin, &end);
  // !(seconds <= max) also refuses NaN; strtod's ERANGE is an overflow or an underflow to (almost) 0.
  if (value.empty() || end == begin || *end != '\0' || errno == ERANGE || !(seconds > 0) ||
      !(seconds <= kMaxSeconds)) {
    char max[32];
    std::snprintf(max, sizeof max, "%.0f", kMaxSeconds);
    throw InvalidArgument(std::string(s.name) + " must be a number of seconds above 0 and at most " + max +
                          " (about 11.6 days), got '" + value + "'");
  }
  return seconds;
}

std::string parse_text(const Setting& s, const std::string& value) {
  if (s.type == Type::kChoice && !value.empty() && !is_choice(s, value)) refuse(s, value, choices_text(s));
  return value;
}

// Checks `value` against the setting's type; throws as the accessors do.
void check(const Setting& s, const std::string& value) {
  switch (s.type) {
    case Type::kFlag:
      parse_flag(s, value);
      return;
    case Type::kInteger:
      parse_integer(s, value);
      return;
    case Type::kSeconds:
      parse_seconds(s, value);
      return;
    case Type::kChoice:
    case Type::kText:
      parse_text(s, value);
      return;
  }
}

const char* type_name(Type type) {
  switch (type) {
    case Type::kFlag:
      return "0 or 1";
    case Type::kInteger:
      return "integer";
    case Type::kSeconds:
      return "seconds";
    case Type::kChoice:
      return "choice";
    case Type::kText:
      return "text";
  }
  return "";
}

const char* reader_name(Reader reader) {
  switch (reader) {
    case Reader::kRuntime:
      return "runtime";
    case Reader::kRestarts:
      return "runtime, set by ddprun";
    case Reader::kTestSeam:
      return "runtime, test seam";
    case Reader::kScripts:
      return "scripts and tests";
  }
  return "";
}

}  // namespace

bool is_set(const Setting& s) { return !raw(s).empty(); }

bool flag(const Setting& s) { return parse_flag(s, value_of(s)); }

std::int64_t integer(const Setting& s) { return parse_integer(s, value_of(s)); }

double seconds(const Setting& s) { return parse_seconds(s, value_of(s)); }

std::string text(const Setting& s) { return parse_text(s, value_of(s)); }

std::string resume_reason() {
  std::int64_t restart = 0;
  try {
    restart = integer(setting("DDP_RESTART"));
  } catch (const InvalidArgument&) {
  }
  if (restart < 1) return "DDP_RESUME=1";
  return "DDP_RESUME=1, restart " + std::to_string(restart) + " of ddprun --max-restarts";
}

std::string environment_errors() {
  std::string errors;
  for (const Setting& s : kTable) {
    if (s.reader == Reader::kScripts) continue;
    const std::string value = raw(s);
    if (value.empty()) continue;
    try {
      check(s, value);
    } catch (const InvalidArgument& e) {
      errors += (errors.empty() ? "" : "\n") + std::string(e.what());
    }
  }
  return errors;
}

std::string markdown_table() {
  const auto cell = [](std::string_view text) {
    std::string escaped;
    for (char c : text) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
    return escaped;
  };
  std::string table = "| variable | type | default | read by | what it does |\n| --- | --- | --- | --- | --- |\n";
  for (const Setting& s : kTable) {
    const std::string type = s.type == Type::kChoice ? cell(s.choices) : type_name(s.type);
    const std::string fallback = s.default_value.empty() ? "unset" : "`" + std::string(s.default_value) + "`";
    table += "| `" + std::string(s.name) + "` | " + type + " | " + fallback + " | " + reader_name(s.reader) +
             " | " + cell(s.summary) + " |\n";
  }
  return table;
}

}  // namespace ddp::settings
