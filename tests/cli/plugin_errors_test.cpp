// A plugin node that throws (tests/cli/hostile_plugin/), run by the real `flowstate run`: every
// exception a node throws, whatever its type, is reported with that node's name and the
// documented exit status (3 from a pull, 4 from a restore), never an abort.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::CliResult;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

const std::string kHostile = FLOWSTATE_HOSTILE_PLUGIN;

class CliNodeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    CliResult r = run({"gen", "records", "--out", "data", "--records", "2000", "--record-bytes",
                       "16", "--shards", "2"});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  /// A pipeline with a fail_at node (in, what, after as given).
  void pipeline(const std::string& in, const std::string& what, int after = 0) {
    write_file(dir_ / "p.yaml",
               "seed: 3\n"
               "source: {type: records, paths: data/*.bin, record_bytes: 16}\n"
               "nodes:\n"
               "  - shuffle: {mode: buffer, size: 64}\n"
               "  - fail_at: {in: " +
                   in + ", what: " + what + ", after: " + std::to_string(after) +
                   "}\n"
                   "  - batch: {size: 8}\n");
  }
  CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  CliResult run_plugin(std::vector<std::string> args) {
    args.insert(args.begin(), {"--plugin", kHostile});
    return run(args);
  }
  TempDir dir_;
};

TEST_F(CliNodeErrors, AnyExceptionFromAPullNamesTheNodeAndExitsWithTheDataStatus) {
  for (const std::string what : {"runtime_error", "bad_alloc", "int", "data_error"}) {
    SCOPED_TRACE(what);
    for (int after : {0, 40}) {
      pipeline("pull", what, after);
      CliResult r = run_plugin({"run", "p.yaml"});
      EXPECT_EQ(r.status, 3) << r.err;
      EXPECT_NE(r.err.find("node 'fail_at': "), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("'spine'"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
    }
  }
  pipeline("pull", "bad_alloc");
  EXPECT_NE(run_plugin({"run", "p.yaml"}).err.find("std::bad_alloc"), std::string::npos);
  pipeline("pull", "int");
  EXPECT_NE(run_plugin({"run", "p.yaml"}).err.find("of type int"), std::string::npos);
}

TEST_F(CliNodeErrors, AnyExceptionFromARestoreNamesTheNodeAndExitsWithTheCheckpointStatus) {
  pipeline("restore", "runtime_error");
  CliResult r = run_plugin(
      {"run", "p.yaml", "--steps", "20", "--checkpoint-dir", "ck", "--checkpoint-every", "5"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string what : {"runtime_error", "bad_alloc", "int"}) {
    SCOPED_TRACE(what);
    pipeline("restore", what);
    r = run_plugin({"run", "p.yaml", "--steps", "30", "--checkpoint-dir", "ck", "--resume"});
    EXPECT_EQ(r.status, 4) << r.err;
    EXPECT_NE(r.err.find("node 'fail_at': "), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("truncated or corrupt"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace flowstate
