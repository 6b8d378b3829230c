// The table of DDP_* variables: typed reads, the refusal of a malformed value, and docs/settings.md as its copy.
#include "runtime/core/settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "runtime/core/check.h"
#include "tests/error_message.h"

namespace ddp::settings {
namespace {

using ::ddp::testing::error_message;

// Sets a variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      ::unsetenv(name_);
    } else {
      ::setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(Settings, EveryNameIsOnceInTheTableAndEveryDefaultIsOfItsType) {
  std::set<std::string_view> names;
  for (const Setting& s : kTable) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " twice";
    EXPECT_EQ(s.name.substr(0, 4), "DDP_") << s.name;
    EXPECT_FALSE(s.summary.empty()) << s.name;
    EXPECT_EQ(s.type == Type::kChoice, !s.choices.empty()) << s.name;
    const std::string name(s.name);
    ::unsetenv(name.c_str());
    EXPECT_EQ(error_message<InvalidArgument>([&] {
                switch (s.type) {
                  case Type::kFlag:
                    flag(s);
                    break;
                  case Type::kInteger:
                    integer(s);
                    break;
                  case Type::kSeconds:
                    seconds(s);
                    break;
                  default:
                    text(s);
                }
              }),
              "(no error)")
        << s.name << "'s default does not parse";
  }
}

TEST(Settings, UnsetOrEmptyMeansTheDefault) {
  constexpr const Setting& pdl = setting("DDP_KERNEL_PDL");
  ::unsetenv("DDP_KERNEL_PDL");
  EXPECT_TRUE(flag(pdl));
  EXPECT_FALSE(is_set(pdl));
  ScopedEnv empty("DDP_KERNEL_PDL", "");
  EXPECT_TRUE(flag(pdl));
  EXPECT_FALSE(is_set(pdl));
  EXPECT_EQ(seconds(setting("DDP_COLLECTIVE_TIMEOUT_S")), 300.0);
  EXPECT_EQ(text(setting("DDP_BACKEND")), "auto");
  EXPECT_EQ(integer(setting("DDP_FAULT_KILL_STEP")), -1);
}

TEST(Settings, ReadsEachType) {
  ScopedEnv pdl("DDP_KERNEL_PDL", "0");
  ScopedEnv step("DDP_FAULT_KILL_STEP", "35");
  ScopedEnv timeout("DDP_COLLECTIVE_TIMEOUT_S", "2.5");
  ScopedEnv backend("DDP_BACKEND", "mpi");
  ScopedEnv stall("DDP_FAULT_STALL", "1:backward:3:stop");
  EXPECT_FALSE(flag(setting("DDP_KERNEL_PDL")));
  EXPECT_TRUE(is_set(setting("DDP_KERNEL_PDL")));
  EXPECT_EQ(integer(setting("DDP_FAULT_KILL_STEP")), 35);
  EXPECT_EQ(seconds(setting("DDP_COLLECTIVE_TIMEOUT_S")), 2.5);
  EXPECT_EQ(text(setting("DDP_BACKEND")), "mpi");
  EXPECT_EQ(text(setting("DDP_FAULT_STALL")), "1:backward:3:stop");
  EXPECT_EQ(environment_errors(), "");
}

// A job's first run with DDP_RESUME=1 is not called a ddprun restart; a relaunch says which one it is.
TEST(Settings, TheResumeReasonSaysARestartOnlyOnARelaunch) {
  ScopedEnv resume("DDP_RESUME", "1");
  {
    ScopedEnv first("DDP_RESTART", "");
    EXPECT_EQ(resume_reason(), "DDP_RESUME=1");
  }
  ScopedEnv second("DDP_RESTART", "2");
  EXPECT_EQ(resume_reason(), "DDP_RESUME=1, restart 2 of ddprun --max-restarts");
}

TEST(Settings, AMalformedValueIsRefusedNamingTheVariableAndWhatItTakes) {
  {
    ScopedEnv v("DDP_FLIGHT_RECORDER", "yes");
    EXPECT_EQ(error_message<InvalidArgument>([] { flag(setting("DDP_FLIGHT_RECORDER")); }),
              "DDP_FLIGHT_RECORDER=yes: expected 0 or 1");
  }
  {
    ScopedEnv v("DDP_FAULT_KILL_RANK", "1x");
    EXPECT_EQ(error_message<InvalidArgument>([] { integer(setting("DDP_FAULT_KILL_RANK")); }),
              "DDP_FAULT_KILL_RANK=1x: expected an integer");
  }
  {
    ScopedEnv v("DDP_BACKEND", "gloo");
    EXPECT_EQ(error_message<InvalidArgument>([] { text(setting("DDP_BACKEND")); }),
              "DDP_BACKEND=gloo: expected auto, nccl or mpi");
  }
  for (const char* value : {"0", "-1", "inf", "nan", "1e10", "5s", "1e-400"}) {
    ScopedEnv v("DDP_COLLECTIVE_TIMEOUT_S", value);
    EXPECT_EQ(error_message<InvalidArgument>([] { seconds(setting("DDP_COLLECTIVE_TIMEOUT_S")); }),
              "DDP_COLLECTIVE_TIMEOUT_S must be a number of seconds above 0 and at most 1000000 (about 11.6 days), "
              "got '" + std::string(value) + "'");
  }
}

TEST(Settings, EnvironmentErrorsListsEveryMalformedVariableOfTheLibrary) {
  ScopedEnv a("DDP_DEBUG", "everything");
  ScopedEnv b("DDP_RESUME", "true");
  ScopedEnv scripts("DDP_TEST_ASAN", "no");  // the scripts' variables are theirs to check
  EXPECT_EQ(environment_errors(),
            "DDP_DEBUG=everything: expected collectives\nDDP_RESUME=true: expected 0 or 1");
}

// docs/settings.md holds the table as markdown_table() writes it, between two marker lines.
TEST(Settings, DocsSettingsPageListsTheTable) {
  std::ifstream page("docs/settings.md");
  ASSERT_TRUE(page) << "docs/settings.md not found";
  std::stringstream text;
  text << page.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- BEGIN settings table (runtime/core/settings.h) -->\n";
  const std::string end = "<!-- END settings table -->";
  const size_t from = doc.find(begin);
  const size_t to = doc.find(end);
  ASSERT_NE(from, std::string::npos) << "no '" << begin << "' line in docs/settings.md";
  ASSERT_NE(to, std::string::npos) << "no '" << end << "' line in docs/settings.md";
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), markdown_table())
      << "docs/settings.md differs from runtime/core/settings.h's table; put this between its marker lines:\n"
      << markdown_table();
}

}  // namespace
}  // namespace ddp::settings
