// Command-line checks the examples share, over CLI11: numbers with their bounds said in words, the unknown
// arguments of a command line with the flag most likely meant, and the parse that every rank reports alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ddp.h"

namespace examples {

// Number checks whose messages say what is wrong in words (CLI11's own print its range bounds, ~300 digits for
// a double) and that refuse NaN and infinity, which compare false with every bound.
inline CLI::Validator number_at_least(double low, bool integer) {
  return CLI::Validator(
      [low, integer](std::string& text) -> std::string {
        double value = 0;
        try {
          std::size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return "must be a number, got '" + text + "'";
        } catch (const std::exception&) {
          return "must be a number, got '" + text + "'";
        }
        if (!std::isfinite(value)) return "must be a finite number, got " + text;
        if (value < low) {
          char bound[32];
          std::snprintf(bound, sizeof bound, "%g", low);
          return std::string("must be at least ") + bound + ", got " + text;
        }
        if (integer && value != std::floor(value)) return "must be a whole number, got " + text;
        return "";
      },
      integer ? "INT>=" + std::to_string(static_cast<long long>(low)) : "NUMBER");
}
inline const CLI::Validator kPositiveInteger = number_at_least(1, true);
inline const CLI::Validator kNonNegativeInteger = number_at_least(0, true);
inline const CLI::Validator kNonNegativeNumber = number_at_least(0, false);
// Above zero: the smallest positive double, so 0 itself is refused.
inline const CLI::Validator kPositiveNumber = number_at_least(std::numeric_limits<double>::denorm_min(), false);

// What CLI11 did not take, in the order given, and the flag the first unknown one most likely meant: one whose
// name starts with it (--batch for --batch-size) or that it starts with.
inline std::string unknown_arguments(const CLI::App& app, const std::vector<std::string>& extras) {
  std::string text = extras.size() == 1 ? "unknown argument" : "unknown arguments";
  for (const std::string& e : extras) text += " '" + e + "'";
  for (const std::string& e : extras) {
    if (e.rfind("--", 0) != 0) continue;
    const std::string name = e.substr(2, e.find('=', 2) - 2);  // up to '=' or the end (npos - 2 stays past it)
    for (const CLI::Option* option : app.get_options()) {
      for (const std::string& known : option->get_lnames()) {
        if (!name.empty() && known != name && (known.rfind(name, 0) == 0 || name.rfind(known, 0) == 0)) {
          return text + "; did you mean --" + known + "?";
        }
      }
    }
    break;
  }
  return text;
}

// A seed: a whole number from 0 to 2^64 - 1 (CLI11 alone would saturate a larger one silently).
inline const CLI::Validator kSeed(
    [](std::string& text) -> std::string {
      try {
        std::size_t used = 0;
        if (!text.empty() && text[0] != '-') {
          std::stoull(text, &used);
          if (used == text.size()) return "";
        }
      } catch (const std::out_of_range&) {
        return "must be at most 18446744073709551615, got " + text;
      } catch (const std::exception&) {
      }
      return "must be a whole number from 0 to 18446744073709551615, got '" + text + "'";
    },
    "UINT64");

// Puts each option named in `groups` ({group, {{option, value}, ...}}) under its group in --help, with its value
// said in words and its default, where CLI11 would print its type and checks ("FLOAT:(NUMBER) AND (FLOAT in
// [0 - 0.9999])=0.9"). Call it once the options exist.
using HelpGroups = std::vector<std::pair<const char*, std::vector<std::pair<const char*, const char*>>>>;
inline void group_help(CLI::App& app, const HelpGroups& groups) {
  for (const auto& [group, options] : groups) {
    for (const auto& [name, value] : options) {
      CLI::Option* option = app.get_option(name);
      const std::string fallback = option->get_default_str();
      option->group(group)->option_text(std::string(value) + (fallback.empty() ? "" : " (default " + fallback + ")"));
    }
  }
}

// Parses `argv` into the options of `app`: --help prints the help (where `prints_help`: one rank of several) and
// exits 0; a bad value or an argument no option takes throws InvalidArgument saying what was wrong (an unknown
// one with the flag most likely meant).
inline void parse_or_throw(CLI::App& app, int argc, char** argv, bool prints_help = true) {
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (prints_help) std::printf("%s", app.help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    throw ddp::InvalidArgument(std::string(e.what()) + " (see --help)");
  }
  if (!app.remaining().empty()) throw ddp::InvalidArgument(unknown_arguments(app, app.remaining()) + " (see --help)");
}

// The flags `parse` returns and, instead of an exception, what was wrong with them. Flags are read before the
// session exists (it needs --device and --backend) and their error is raised once it does, through the session's
// agree, so a typo ends every rank with one message and the job still ends cleanly.
template <typename Flags, typename Parse>
std::pair<Flags, std::string> parse_now_report_later(Parse&& parse) {
  try {
    return {parse(), ""};
  } catch (const ddp::InvalidArgument& e) {
    return {Flags{}, e.what()};
  }
}

}  // namespace examples
