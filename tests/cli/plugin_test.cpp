// The example plugin (examples/plugin/) loaded by the real `flowstate` command, as a user
// would load it: `--plugin PATH.so` and a YAML's `plugins:`; its node runs, checkpoints,
// resumes after a SIGKILL and shows in `inspect`.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::by_step;
using testing::CliProcess;
using testing::CliResult;
using testing::read_lines;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

/// The built plugin library (a compile definition from CMake).
const std::string kPlugin = FLOWSTATE_EXAMPLE_PLUGIN;

/// 20000 records; take 5000 of each epoch in batches of 16: 313 steps per epoch.
std::string pipeline(const std::string& plugin_line) {
  return "seed: 21\n" + plugin_line +
         "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
         "nodes:\n"
         "  - shuffle: {mode: buffer, size: 300}\n"
         "  - take: {count: 5000}\n"
         "  - batch: {size: 16}\n"
         "epochs: 2\n";
}

class CliPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    CliResult r = run({"gen", "records", "--out", "data", "--records", "20000", "--record-bytes",
                       "64", "--shards", "4"});
    ASSERT_EQ(r.status, 0) << r.err;
    // Relative to the YAML file's directory, as a user would write it.
    const std::string rel = fs::relative(kPlugin, dir_.path()).string();
    write_file(dir_ / "p.yaml", pipeline("plugins: [" + rel + "]\n"));
  }

  CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  std::string path(const std::string& name) const { return dir_ / name; }

  TempDir dir_;
};

TEST_F(CliPlugin, AProcessThatLoadedAPluginRunsTheLibrariesTeardown) {
  // A plugin's statics are its author's: with one loaded, the command exits normally (without
  // one it skips the teardown, tests/cli/startup_test.cpp), and the dynamic loader calls the
  // libraries' destructors, the plugin's among them.
  ::setenv("LD_DEBUG", "files", 1);
  CliResult r = run({"--plugin", kPlugin, "schema"});
  ::unsetenv("LD_DEBUG");
  ASSERT_EQ(r.status, 0) << r.err;
  // The library as config/plugins.cpp opened it (its weakly canonical path).
  const std::string fini = "calling fini: " + fs::weakly_canonical(kPlugin).string();
  EXPECT_NE(r.err.find(fini), std::string::npos) << "no '" << fini << "' in:\n" << r.err;
}

TEST_F(CliPlugin, SchemaListsThePluginsNode) {
  CliResult r = run({"--plugin", kPlugin, "schema"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\ntake [plugin "), std::string::npos) << r.out;
  r = run({"--plugin", kPlugin, "schema", "take"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("keeps the first `count` samples of every epoch"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  count (an unsigned integer, required, >= 1): samples kept at the start "
                       "of each epoch\n"),
            std::string::npos)
      << r.out;
}

TEST_F(CliPlugin, SigkillMidRunThenResumeEqualsAnUninterruptedRun) {
  CliResult r = run({"run", "p.yaml", "--digests", "full.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(read_lines(path("full.txt")).size(), 2u * 313u);

  // Epochs 0: the killed run cannot end before it is killed (epochs never change the batches).
  CliProcess p({"run", "p.yaml", "--epochs", "0", "--checkpoint-dir", "ck", "--checkpoint-every",
                "7", "--digests", "part.txt"},
               dir_.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto has_checkpoint = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path("ck"), ec))
      if (e.path().filename().string().rfind("step-", 0) == 0) return true;
    return false;
  };
  while (read_lines(path("part.txt")).size() < 40 || !has_checkpoint()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no checkpoint in 30 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.signal(SIGKILL);
  r = p.wait();
  ASSERT_EQ(r.status, 128 + SIGKILL) << r.err;
  const std::size_t before = read_lines(path("part.txt")).size();
  ASSERT_LT(before, 2u * 313u) << "killed after the end of the uninterrupted run";

  r = run({"run", "p.yaml", "--checkpoint-dir", "ck", "--resume", "--digests", "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-"), std::string::npos) << r.err;
  // The steps after the last checkpoint ran twice, identically; nothing lost or added.
  EXPECT_EQ(by_step(read_lines(path("part.txt"))), read_lines(path("full.txt")));
}

TEST_F(CliPlugin, StagesAfterBatchFromAPluginVerifyAndRun) {
  // slice (a plan stage, like shard after batch) and checksum (a batch-time stage, like
  // device_copy) come from the plugin; the runtime knows neither.
  const std::string rel = fs::relative(kPlugin, dir_.path()).string();
  write_file(dir_ / "s.yaml", "seed: 4\nplugins: [" + rel +
                                  "]\n"
                                  "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
                                  "nodes:\n"
                                  "  - shuffle: {mode: buffer, size: 500}\n"
                                  "  - batch: {size: 16}\n"
                                  "  - slice: {count: 5}\n"
                                  "  - prefetch: {depth: 3}\n"
                                  "  - checksum: {field: sum}\n"
                                  "epochs: 2\n");
  CliResult r = run({"verify", "s.yaml", "--steps", "300", "--trials", "3", "--seed", "2"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.err,
            "flowstate: verify ok: 3 restores reproduced the uninterrupted run exactly "
            "(--seed 2)\n");
  r = run({"run", "s.yaml", "--steps", "10", "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_lines(path("d.txt")).size(), 10u);
  // Where the plugin's node may stand is its own rule, said by the builder at the YAML entry.
  write_file(dir_ / "bad.yaml", "plugins: [" + rel +
                                    "]\n"
                                    "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
                                    "nodes:\n"
                                    "  - batch: {size: 16}\n"
                                    "  - prefetch: {depth: 3}\n"
                                    "  - slice: {count: 5}\n");
  r = run({"validate", "bad.yaml"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("bad.yaml:6:5: nodes[2].slice: 'slice' after batch must follow it "
                       "directly (it chooses which samples each batch reads)"),
            std::string::npos)
      << r.err;
}

TEST_F(CliPlugin, ATransformAndAPredicateFromAPluginWorkInEveryInputOfAMix) {
  // The plugin is loaded by the top file only; its xor_bytes and byte_below are known in every
  // mix input. byte_below 128 keeps exactly what the built-in value (max 127) keeps, and
  // xor_bytes twice with one key gives the bytes back: the two mixes hand out the same batches.
  const std::string rel = fs::relative(kPlugin, dir_.path()).string();
  const std::string source = "source: {type: records, paths: data/*.bin, record_bytes: 64}\n";
  write_file(dir_ / "plugin_in.yaml", source +
                                          "nodes:\n"
                                          "  - filter: {fn: byte_below, below: 128}\n"
                                          "  - map: {fn: xor_bytes, key: 90}\n"
                                          "  - map: {fn: xor_bytes, key: 90}\n");
  write_file(dir_ / "builtin_in.yaml",
             source + "nodes:\n  - filter: {fn: value, field: data, max: 127}\n");
  write_file(dir_ / "other_in.yaml", source + "nodes:\n  - shuffle: {mode: global}\n");
  auto mix = [&](const std::string& input, const std::string& plugins) {
    return "seed: 8\n" + plugins + "source: {type: mix, inputs: [" + input +
           ", other_in.yaml], weights: [1, 1]}\n"
           "nodes:\n  - batch: {size: 16}\n";
  };
  write_file(dir_ / "plugin_mix.yaml", mix("plugin_in.yaml", "plugins: [" + rel + "]\n"));
  write_file(dir_ / "builtin_mix.yaml", mix("builtin_in.yaml", ""));
  CliResult r = run({"run", "plugin_mix.yaml", "--steps", "40", "--digests", "plugin.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run({"run", "builtin_mix.yaml", "--steps", "40", "--digests", "builtin.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(read_lines(path("plugin.txt")).size(), 40u);
  EXPECT_EQ(read_lines(path("plugin.txt")), read_lines(path("builtin.txt")));
  r = run({"verify", "plugin_mix.yaml", "--steps", "60", "--trials", "2", "--seed", "3"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // One xor_bytes changes every byte: the batches differ.
  write_file(dir_ / "plugin_in.yaml", source +
                                          "nodes:\n  - filter: {fn: byte_below, below: 128}\n"
                                          "  - map: {fn: xor_bytes, key: 90}\n");
  r = run({"run", "plugin_mix.yaml", "--steps", "40", "--digests", "once.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(read_lines(path("once.txt")), read_lines(path("builtin.txt")));
  // Their tables check their parameters, with the input file's location.
  write_file(dir_ / "plugin_in.yaml", source + "nodes:\n  - map: {fn: xor_bytes, key: 300}\n");
  r = run({"validate", "plugin_mix.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("plugin_in.yaml:3:31: nodes[0].map.key: 300 is out of range (must be at "
                       "most 255)"),
            std::string::npos)
      << r.err;
  // And the schema lists them with what their tables declare.
  r = run({"--plugin", kPlugin, "schema", "byte_below"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("filter fn: byte_below: keeps the samples whose field's first byte is "
                       "below `below`\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  below (an unsigned integer, required, 1..256): kept: a first byte "
                       "below this\n"),
            std::string::npos)
      << r.out;
}

TEST_F(CliPlugin, InspectDecodesTheNodesStateWithThePlugin) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "100", "--checkpoint-dir", "ck"}).status, 0);
  CliResult r = run({"--plugin", kPlugin, "inspect", "ck", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["nodes"].size(), 4u) << r.out;
  EXPECT_EQ(j["nodes"][2]["name"], "take");
  EXPECT_EQ(j["nodes"][2]["type"], "take");
  EXPECT_EQ(j["nodes"][2]["state"]["epoch"], 0);
  EXPECT_EQ(j["nodes"][2]["state"]["taken"], 100 * 16);
  r = run({"--plugin", kPlugin, "inspect", "ck"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  take (take): epoch 0, taken 1600\n"), std::string::npos) << r.out;
}

TEST_F(CliPlugin, InspectWithoutThePluginShowsTheNodeUndecoded) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "100", "--checkpoint-dir", "ck"}).status, 0);
  CliResult r = run({"inspect", "ck", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["nodes"].size(), 4u) << r.out;
  EXPECT_EQ(j["nodes"][2]["name"], "take");
  EXPECT_EQ(j["nodes"][2]["unknown_type"], true);
  EXPECT_FALSE(j["nodes"][2].contains("state"));
  EXPECT_GT(j["nodes"][2]["state_bytes"], 0);
  EXPECT_EQ(j["nodes"][3]["state"]["next_step"], 100);  // the nodes after it still decode
  r = run({"inspect", "ck"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  take (take): not decoded: no node type 'take' is registered (load its "
                       "plugin with --plugin); "),
            std::string::npos)
      << r.out;
}

TEST_F(CliPlugin, WithoutItsPluginTheNodeIsAnErrorNamingIt) {
  write_file(path("np.yaml"), pipeline(""));
  CliResult r = run({"run", "np.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("np.yaml:5:5: nodes[1]: unknown node type 'take'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace flowstate
