// `flowstate inspect FILE` on a raw state file (the bytes of Loader::state()): the same
// description as for the checkpoint holding those bytes, and a clear CheckpointError (exit 4)
// for a file that is not a state.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "flowstate/config/yaml.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::read_file;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

constexpr const char* kPipeline =
    "seed: 5\n"
    "source: {type: records, paths: data/*.bin, record_bytes: 32}\n"
    "nodes:\n"
    "  - shuffle: {mode: buffer, size: 50}\n"
    "  - batch: {size: 10}\n"
    "epochs: 2\n";

class InspectState : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::CliResult r = run({"gen", "records", "--out", "data", "--records", "400",
                                "--record-bytes", "32", "--shards", "2"});
    ASSERT_EQ(r.status, 0) << r.err;
    write_file(dir_ / "p.yaml", kPipeline);
    ASSERT_EQ(run({"run", "p.yaml", "--steps", "47", "--checkpoint-dir", "ck", "--checkpoint-every",
                   "47"})
                  .status,
              0);
  }
  testing::CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  TempDir dir_;
};

TEST_F(InspectState, ARawStateFileShowsWhatItsCheckpointShows) {
  const std::string state = read_file(dir_ / "ck/step-000000000047/state.bin");
  ASSERT_FALSE(state.empty());
  write_file(dir_ / "loader.state", state);  // what Loader::state() returned, in a file

  testing::CliResult file = run({"inspect", "loader.state"});
  ASSERT_EQ(file.status, 0) << file.err;
  testing::CliResult ck = run({"inspect", "ck"});
  ASSERT_EQ(ck.status, 0) << ck.err;
  // Everything after the first line (where it came from) is the same.
  EXPECT_EQ(file.out.substr(0, file.out.find('\n')), "state file: loader.state");
  EXPECT_EQ(file.out.substr(file.out.find('\n')), ck.out.substr(ck.out.find('\n')));
  const std::string fingerprint = hex64(from_yaml_file(dir_ / "p.yaml").fingerprint());
  EXPECT_NE(file.out.find("step: 47 (batches consumed; the next batch is step 47)\n"
                          "last delivered: step 46, epoch 1\n"
                          "format version: 1\n"
                          "fingerprint: " +
                          fingerprint + "\n"),
            std::string::npos)
      << file.out;
  EXPECT_NE(file.out.find("  shuffle (shuffle): epoch 1, "), std::string::npos) << file.out;

  testing::CliResult j = run({"inspect", "loader.state", "--json"});
  ASSERT_EQ(j.status, 0) << j.err;
  auto a = nlohmann::json::parse(j.out);
  auto b = nlohmann::json::parse(run({"inspect", "ck", "--json"}).out);
  EXPECT_EQ(a["source"], "file");
  EXPECT_EQ(a["path"], "loader.state");
  EXPECT_EQ(a["bytes"], state.size());
  EXPECT_EQ(b["source"], "checkpoint");
  for (const char* key : {"step", "format_version", "fingerprint", "last_step", "last_epoch",
                          "pipeline", "skipped_steps", "nodes"})
    EXPECT_EQ(a[key], b[key]) << key;
}

TEST_F(InspectState, AFileThatIsNotAStateIsACheckpointError) {
  write_file(dir_ / "notes.txt", "hello\n");
  testing::CliResult r = run({"inspect", "notes.txt"});
  EXPECT_EQ(r.status, 4);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("'notes.txt' is not a flowstate state (bad magic)"), std::string::npos)
      << r.err;

  // Cut short: truncated, named.
  const std::string state = read_file(dir_ / "ck/step-000000000047/state.bin");
  write_file(dir_ / "cut.state", state.substr(0, state.size() / 2));
  r = run({"inspect", "cut.state"});
  EXPECT_EQ(r.status, 4);
  EXPECT_NE(r.err.find("'cut.state'"), std::string::npos) << r.err;

  // A torch.save'd file (a zip archive) is pointed at Python's describe_state.
  write_file(dir_ / "train.pt", std::string("PK\x03\x04", 4) + "rest of an archive");
  r = run({"inspect", "train.pt"});
  EXPECT_EQ(r.status, 4);
  EXPECT_NE(r.err.find("torch.save"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("flowstate.describe_state(torch.load(FILE)[KEY])"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace flowstate
