// Every YAML pipeline in examples/pipelines/ runs as its comment says: copied next to data
// made by `flowstate gen`, then validated, run and verified with the command.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::CliResult;
using testing::run_cli;
using testing::TempDir;

namespace fs = std::filesystem;

struct Example {
  std::string file;
  std::string record_bytes;  ///< what the pipeline reads
  std::string records;       ///< a small data set
};

void PrintTo(const Example& e, std::ostream* os) { *os << e.file; }

class Examples : public ::testing::TestWithParam<Example> {};

TEST_P(Examples, RunsOnGeneratedData) {
  const Example& e = GetParam();
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines" / e.file, dir / e.file);
  CliResult r = run_cli({"gen", "records", "--out", "data", "--records", e.records,
                         "--record-bytes", e.record_bytes, "--shards", "3"},
                        dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"validate", e.file}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data: ok\n"), std::string::npos);
  r = run_cli({"run", e.file, "--steps", "20", "--digests", "d.txt"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex("run finished \\(reached --steps 20\\): 20 batches")))
      << r.err;
  EXPECT_EQ(testing::read_lines(dir / "d.txt").size(), 20u);
  r = run_cli({"verify", e.file, "--steps", "24", "--trials", "3"}, dir.str());
  EXPECT_EQ(r.status, 0) << r.out << r.err;
}

INSTANTIATE_TEST_SUITE_P(Pipelines, Examples,
                         ::testing::Values(Example{"llm_tokens.yaml", "1024", "2048"},
                                           Example{"records_parallel_map.yaml", "256", "512"},
                                           Example{"device_copy.yaml", "64", "3000"}),
                         [](const auto& info) {
                           std::string n = info.param.file.substr(0, info.param.file.find('.'));
                           return n;
                         });

TEST(Examples, LlmTokensDeliversUint16Tokens) {
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines/llm_tokens.yaml",
                dir / "llm_tokens.yaml");
  ASSERT_EQ(
      run_cli({"gen", "records", "--out", "data", "--records", "640", "--record-bytes", "1024"},
              dir.str())
          .status,
      0);
  // Its checkpoint section applies: the run ends with a checkpoint under the YAML's directory.
  CliResult r = run_cli({"run", "llm_tokens.yaml", "--steps", "4"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: checkpoint ckpt/step-000000000004\n"), std::string::npos)
      << r.err;
  r = run_cli({"inspect", "ckpt", "--json"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"value\": \"uint16\""), std::string::npos);
  EXPECT_NE(r.out.find("\"value\": \"[512]\""), std::string::npos);
}

}  // namespace
}  // namespace flowstate
