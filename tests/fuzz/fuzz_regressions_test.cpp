// Replays every input under fuzz/regressions/<target>/ — inputs that once crashed a fuzzer, or
// were written by hand to probe the readers — and the seeds under fuzz/corpus/<target>/
// through the same code the fuzzer runs. Each must end in a flowstate::Error or in success:
// never another exception, never a crash.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fuzz/fuzz_targets.h"

namespace flowstate {
namespace {

/// The inputs kept for `target` under fuzz/`kind`/ (regressions or corpus), sorted.
std::vector<std::filesystem::path> inputs(const std::string& target,
                                          const std::string& kind = "regressions") {
  std::vector<std::filesystem::path> out;
  const auto dir = std::filesystem::path(FLOWSTATE_SOURCE_DIR) / "fuzz" / kind / target;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// The regression inputs of `target`, then its seeds.
std::vector<std::filesystem::path> all_inputs(const std::string& target) {
  auto out = inputs(target);
  for (auto& p : inputs(target, "corpus")) out.push_back(std::move(p));
  return out;
}

std::string bytes_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FuzzRegressions, YamlInputsEndInAFlowstateErrorAtWorst) {
  const auto files = inputs("yaml");
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string b = bytes_of(f);
    EXPECT_NO_THROW(
        fuzz::yaml_one_input(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
  }
}

TEST(FuzzRegressions, TarInputsEndInAFlowstateErrorAtWorst) {
  const auto files = all_inputs("tar");
  ASSERT_FALSE(inputs("tar").empty());
  const fuzz::ScratchDir dir;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string b = bytes_of(f);
    EXPECT_NO_THROW(
        fuzz::tar_one_input(dir, reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
  }
}

TEST(FuzzRegressions, LinesInputsEndInAFlowstateErrorAtWorst) {
  const auto files = all_inputs("lines");
  ASSERT_FALSE(inputs("lines").empty());
  const fuzz::ScratchDir dir;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string b = bytes_of(f);
    EXPECT_NO_THROW(
        fuzz::lines_one_input(dir, reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
  }
}

TEST(FuzzRegressions, MegatronInputsEndInAFlowstateErrorAtWorst) {
  const auto files = all_inputs("megatron");
  ASSERT_FALSE(inputs("megatron").empty());
  const fuzz::ScratchDir dir;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string b = bytes_of(f);
    EXPECT_NO_THROW(
        fuzz::megatron_one_input(dir, reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
  }
}

TEST(FuzzRegressions, IndexInputsEndInAFlowstateErrorAtWorst) {
  const auto files = all_inputs("index");
  ASSERT_FALSE(inputs("index").empty());
  fuzz::IndexTarget target;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const std::string b = bytes_of(f);
    EXPECT_NO_THROW(
        (void)target.one_input(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()));
  }
}

TEST(FuzzRegressions, IndexSeedsAreReadWithoutError) {
  // Each seed is a cache the sources accept, raw or as a payload (a broken seed would make
  // the fuzzer blind).
  fuzz::IndexTarget target;
  const auto seeds = target.seeds();
  ASSERT_EQ(seeds.size(), 6u);
  for (const auto& s : seeds)
    EXPECT_TRUE(target.one_input(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

/// Replays the state inputs and ends the process: 0 when each ended in a flowstate::Error at
/// worst. Under an address-space cap (without AddressSanitizer, which needs its own), so an
/// input claiming a huge length fails to allocate instead of filling the machine's memory.
[[noreturn]] void replay_states() {
#if !defined(__SANITIZE_ADDRESS__)
  const rlimit cap{rlim_t{8} << 30, rlim_t{8} << 30};
  ::setrlimit(RLIMIT_AS, &cap);
#endif
  bool ok = true;
  {
    fuzz::StateTarget target;
    for (const auto& f : inputs("state")) {
      const std::string b = bytes_of(f);
      try {
        (void)target.one_input(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", f.c_str(), e.what());
        ok = false;
      }
    }
  }
  std::fflush(stderr);
  std::_Exit(ok ? 0 : 1);  // no static destructors in the death-test child
}

TEST(FuzzRegressions, StateInputsEndInAFlowstateErrorAtWorst) {
  ASSERT_FALSE(inputs("state").empty());
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(replay_states(), ::testing::ExitedWithCode(0), "");
}

TEST(FuzzRegressions, StateSeedsRestore) {
  // The seed corpus is valid: each restores and continues (a broken seed would make the
  // fuzzer blind).
  fuzz::StateTarget target;
  const auto seeds = target.seeds();
  ASSERT_GE(seeds.size(), 5u);
  for (const auto& s : seeds)
    EXPECT_TRUE(target.one_input(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

}  // namespace
}  // namespace flowstate
