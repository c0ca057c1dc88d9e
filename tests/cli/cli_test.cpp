// The `flowstate` command run as a user would: from a temporary directory, on data it
// generates itself, checking outputs, exit statuses and messages.
// Over 600 lines: one fixture (a scratch directory and the built command) for every command's
// end-to-end cases; gen's formats, inspect of a state file and plugins have files of their own.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "flowstate/config/yaml.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::by_step;
using testing::CliProcess;
using testing::CliResult;
using testing::read_file;
using testing::read_lines;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

/// 2000 records of 64 bytes in 4 shards; batches of 16: 125 steps per epoch.
constexpr const char* kPipeline =
    "seed: 21\n"
    "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
    "nodes:\n"
    "  - shuffle: {mode: buffer, size: 300}\n"
    "  - map: {fn: random_crop, length: 40, workers: 2}\n"
    "  - batch: {size: 16}\n"
    "  - prefetch: {depth: 3}\n"
    "epochs: 2\n";

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    CliResult r = run({"gen", "records", "--out", "data", "--records", "2000", "--record-bytes",
                       "64", "--shards", "4"});
    ASSERT_EQ(r.status, 0) << r.err;
    write_file(dir_ / "p.yaml", kPipeline);
  }

  CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  std::string path(const std::string& name) const { return dir_ / name; }

  /// Digest lines of the pipeline computed in process, for `steps` batches.
  std::vector<std::string> expected_digests(std::size_t steps, int epochs = 2) {
    Loader loader(from_yaml_file(path("p.yaml")), {.epochs = static_cast<std::uint64_t>(epochs)});
    std::vector<std::string> out;
    while (out.size() < steps) {
      auto b = loader.next();
      if (!b) break;
      out.push_back(std::to_string(b->info.step) + " " + std::to_string(b->info.epoch) + " " +
                    std::to_string(b->info.index_in_epoch) + " " + hex64(b->digest()));
    }
    return out;
  }

  TempDir dir_;
};

/// The names in a directory.
std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// "step-000000000120"
std::string step_dir(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012llu", static_cast<unsigned long long>(step));
  return buf;
}

// ---- gen ----

TEST_F(Cli, GenWritesTheDocumentedRecords) {
  TempDir ref;
  testing::write_records(ref.str(), 2000, 64, 4, 7);
  for (int s = 0; s < 4; ++s) {
    const std::string name = "part-0000" + std::to_string(s) + ".bin";
    EXPECT_EQ(read_file(path("data/" + name)), read_file(ref / name)) << name;
  }
  std::size_t bins = 0;
  for (const auto& e : fs::directory_iterator(path("data"))) bins += e.path().extension() == ".bin";
  EXPECT_EQ(bins, 4u);
}

TEST_F(Cli, GenTruncatesTheIndexOfShortRecordsAndHonoursTheSeed) {
  CliResult r = run({"gen", "records", "--out", "short", "--records", "300", "--record-bytes", "3",
                     "--seed", "9"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string bytes = read_file(path("short/part-00000.bin"));
  ASSERT_EQ(bytes.size(), 900u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[3 * 258]), 258 % 256);
  EXPECT_EQ(static_cast<unsigned char>(bytes[3 * 258 + 1]), 1);
  EXPECT_EQ(static_cast<unsigned char>(bytes[3 * 258 + 2]), 0);
  ASSERT_EQ(run({"gen", "records", "--out", "s9", "--records", "10", "--record-bytes", "32",
                 "--seed", "9"})
                .status,
            0);
  TempDir ref;
  testing::write_records(ref.str(), 10, 32, 1, 9);
  EXPECT_EQ(read_file(path("s9/part-00000.bin")), read_file(ref / "part-00000.bin"));
}

TEST_F(Cli, GenRefusesADirectoryWithOtherBinFiles) {
  write_file(path("data/other.bin"), "x");
  CliResult r = run({"gen", "records", "--out", "data", "--records", "10", "--record-bytes", "8",
                     "--shards", "4"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --out: 'data' already holds 'other.bin', which is not part of "
            "this data set; use an empty directory (files named *.bin would be read with it)\n");
  r = run({"gen", "records", "--records", "10", "--record-bytes", "8"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "flowstate: error: --out is required (see 'flowstate gen --help')\n");
  r = run({"gen", "records", "--out", "x", "--records", "10", "--record-bytes", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --record-bytes 0 is out of range (must be between 1 and "
            "1073741824) (see 'flowstate gen --help')\n");
}

// ---- validate ----

TEST_F(Cli, ValidatePrintsTheResolvedGraphAndFingerprint) {
  CliResult r = run({"validate", "p.yaml"});
  ASSERT_EQ(r.status, 0) << r.err;
  const Pipeline p = from_yaml_file(path("p.yaml"));
  EXPECT_EQ(r.out, "pipeline: p.yaml\n" + p.describe() +
                       "epochs: 2\nfingerprint: " + hex64(p.fingerprint()) + "\ndata: ok\n");
  // Defaults are filled in; free parameters are marked.
  EXPECT_NE(r.out.find("      seed: 0\n"), std::string::npos);
  EXPECT_NE(r.out.find("      field: data\n"), std::string::npos);
  EXPECT_NE(r.out.find("      workers: 2 (free)\n"), std::string::npos);
}

TEST_F(Cli, ValidateWithOverridesMatchesTheEditedFile) {
  write_file(path("q.yaml"), std::string(kPipeline) + "checkpoint: {dir: ck, every_steps: 9}\n");
  CliResult a = run({"validate", "p.yaml", "--set", "seed=5", "--set", "checkpoint.dir=ck", "--set",
                     "checkpoint.every_steps=9"});
  std::string edited = kPipeline;
  edited.replace(edited.find("seed: 21"), 8, "seed: 5");
  write_file(path("q.yaml"), edited + "checkpoint: {dir: ck, every_steps: 9}\n");
  CliResult b = run({"validate", "q.yaml"});
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out.substr(a.out.find('\n')), b.out.substr(b.out.find('\n')));
  EXPECT_NE(a.out.find("checkpoint:\n      dir: ck\n      every_steps: 9\n      keep: 0\n"),
            std::string::npos);
}

TEST_F(Cli, ValidateReportsMissingDataUnlessToldNotToOpenIt) {
  CliResult r = run({"validate", "p.yaml", "--set", "source.paths=nothing/*.bin"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err, "flowstate: error: no file matches 'nothing/*.bin'\n");
  r = run({"validate", "p.yaml", "--set", "source.paths=nothing/*.bin", "--no-data"});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(Cli, ValidateRefusesWhatRunRefusesAtStartUp) {
  // A decode shape that the 64-byte records do not fit passes the configuration checks; run
  // finds it in the first batch, and so does validate, with the same message and status.
  write_file(path("decode.yaml"),
             "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
             "nodes:\n"
             "  - map: {fn: decode, dtype: uint16, shape: [3, 7]}\n"
             "  - batch: {size: 16}\n");
  CliResult v = run({"validate", "decode.yaml"});
  CliResult r = run({"run", "decode.yaml"});
  EXPECT_EQ(v.status, 3) << v.err;
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(v.out.find("data: ok"), std::string::npos) << v.out;
  // The same message up to the record, which depends on the order the workers take them.
  const auto upto_record = [](const std::string& e) { return e.substr(0, e.find("(in record")); };
  EXPECT_EQ(upto_record(v.err), upto_record(r.err));
  EXPECT_NE(v.err.find("needs 42 bytes (in record 0:"), std::string::npos) << v.err;
  // Only the configuration: nothing to refuse.
  EXPECT_EQ(run({"validate", "decode.yaml", "--no-data"}).status, 0);
}

TEST_F(Cli, SetAddressesNodesByNameAndNamesItselfInErrors) {
  CliResult by_name = run({"validate", "p.yaml", "--set", "shuffle.size=1024"});
  CliResult by_index = run({"validate", "p.yaml", "--set", "nodes[0].shuffle.size=1024"});
  ASSERT_EQ(by_name.status, 0) << by_name.err;
  EXPECT_EQ(by_name.out, by_index.out);
  EXPECT_NE(by_name.out.find("size: 1024"), std::string::npos) << by_name.out;
  CliResult r = run({"validate", "p.yaml", "--set", "nodes[0].size=10"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --set nodes[0].size=10: nodes[0] is a 'shuffle' node, whose "
            "parameters are set as nodes[0].shuffle.KEY; did you mean nodes[0].shuffle.size?\n");
  r = run({"validate", "p.yaml", "--set", "random_crop.length=0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --set random_crop.length=0: nodes[1].map.length: 0 is out of range "
            "(must be between 1 and 9e+15)\n");
}

// ---- the command line ----

TEST_F(Cli, VersionHelpAndDidYouMean) {
  CliResult r = run({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(std::regex_match(r.out, std::regex("flowstate [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
  CliResult help = run({"help", "run"});
  CliResult flag = run({"run", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_EQ(help.out, flag.out);
  EXPECT_NE(help.out.find("--checkpoint-every K"), std::string::npos);
  EXPECT_NE(help.out.find("checkpoint.every_steps"), std::string::npos);
  EXPECT_NE(help.out.find("143 stopped by SIGTERM, 130 by\nSIGINT"), std::string::npos) << help.out;
  r = run({"run", "p.yaml", "--chekpoint-dir", "ck"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: unknown option '--chekpoint-dir'; did you mean "
            "'--checkpoint-dir'? (see 'flowstate run --help')\n");
  r = run({"rnu", "p.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("flowstate: error: unknown command 'rnu'; did you mean 'run'?\n"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, ASecondRunOnAHeldCheckpointDirectoryIsRefusedNamingTheHolder) {
  // The first run holds ck until it dies (epochs 0: it does not end on its own).
  CliProcess first(
      {"run", "p.yaml", "--epochs", "0", "--checkpoint-dir", "ck", "--checkpoint-every", "20"},
      dir_.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(path("ck/" + step_dir(20)))) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no checkpoint in 30 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::string holder = "in use by another run (pid " + std::to_string(first.pid()) + ", ";
  for (const std::vector<std::string>& more :
       {std::vector<std::string>{"--resume"}, {}, {"--overwrite"}}) {
    std::vector<std::string> args = {"run", "p.yaml", "--steps", "300", "--checkpoint-dir", "ck"};
    args.insert(args.end(), more.begin(), more.end());
    CliResult r = run(args);
    EXPECT_EQ(r.status, 4) << r.err;
    EXPECT_NE(r.err.find("flowstate: error: checkpoint directory 'ck' is " + holder +
                         "which holds the lock 'ck/.run.lock')"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("resumed"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(first.exited());
  EXPECT_TRUE(fs::exists(path("ck/LATEST")));  // --overwrite discarded nothing
  // A SIGKILL leaves nothing held: the next run resumes (and takes 5 steps more).
  first.signal(SIGKILL);
  EXPECT_EQ(first.wait().status, 128 + SIGKILL);
  std::uint64_t newest = 0;
  for (const auto& e : fs::directory_iterator(path("ck"))) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos)
      newest = std::max<std::uint64_t>(newest, std::stoull(name.substr(5)));
  }
  CliResult r = run({"run", "p.yaml", "--epochs", "0", "--steps", std::to_string(newest + 5),
                     "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-"), std::string::npos) << r.err;
}

TEST_F(Cli, CheckpointEveryIsTheYamlsEverySteps) {
  CliResult r =
      run({"run", "p.yaml", "--steps", "10", "--checkpoint-dir", "ck", "--checkpoint-every", "4"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("ck/" + step_dir(4))));
  EXPECT_TRUE(fs::exists(path("ck/" + step_dir(8))));
  EXPECT_TRUE(fs::exists(path("ck/" + step_dir(10))));  // the end
}

TEST_F(Cli, ProgressShowsPercentAndEtaWhenTheStepsAreKnown) {
  // --steps: the total.
  CliResult r = run({"run", "p.yaml", "--steps", "40", "--progress-interval", "0"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("flowstate: step 19  epoch 0  [0-9.]+ [kMG]?samples/s  [0-9.]+ "
                        "[kMG]?B/s  50\\.0%  ETA [0-9]+[hms0-9]*\n")))
      << r.err;
  // Epochs x batches per epoch: the total.
  r = run({"run", "p.yaml", "--epochs", "1", "--progress-interval", "0"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex("flowstate: step 24  epoch 0  .*  20\\.0%  ETA ")))
      << r.err;
}

TEST_F(Cli, ProgressIntervalIsSecondsLikeTheMetricsInterval) {
  // The help says seconds: a fraction is accepted, as --metrics-interval's is.
  CliResult r = run({"run", "p.yaml", "--steps", "5", "--progress-interval", "0.5"});
  EXPECT_EQ(r.status, 0) << r.err;
  r = run({"run", "p.yaml", "--steps", "5", "--progress-interval", "0.5", "--metrics", "m.jsonl",
           "--metrics-interval", "0.2"});
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* bad : {"-1", "soon", "0.5s"}) {
    r = run({"run", "p.yaml", "--steps", "5", "--progress-interval", bad});
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_NE(r.err.find("--progress-interval expects a non-negative number of seconds, got '" +
                         std::string(bad) + "'"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(Cli, BenchNamesTheBottleneckAndWarnsWhenTheTimingIsShort) {
  CliResult r = run({"bench", "p.yaml", "--steps", "20", "--warmup", "2", "--repeat", "1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("\nbottleneck: ([a-z_:#]+ — [0-9]+% busy (on [0-9]+ workers?|in the "
                        "spine|in deliver).*|the consumer — [0-9]+% busy, the graph waited on "
                        "it [0-9]+ times, it on the graph [0-9]+|none saturated — .*|not "
                        "measured — .*--steps\\))\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("flowstate: warning: the timed part took [0-9.]+ m?s, shorter than a "
                        "second: the numbers are noisy; time more batches \\(--steps\\)\n")))
      << r.err;
}

TEST_F(Cli, BenchShowsWhatAutoChose) {
  CliResult r = run({"bench", "p.yaml", "--steps", "40", "--warmup", "2", "--repeat", "1",
                     "--workers", "auto", "--prefetch", "auto"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("\nautotune: workers: auto → [0-9]+, prefetch "
                                                  "depth: auto → [0-9]+ \\([0-9]+ changes\\)\n")))
      << r.out;
  // Without auto, no such line; a bad value is a usage error.
  r = run({"bench", "p.yaml", "--steps", "5", "--warmup", "0", "--repeat", "1", "--workers", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find("autotune:"), std::string::npos) << r.out;
  EXPECT_EQ(run({"bench", "p.yaml", "--workers", "many"}).status, 2);
}

TEST_F(Cli, BenchTraceShowsTheNodeTheVerdictNames) {
  CliResult r = run(
      {"bench", "p.yaml", "--steps", "200", "--warmup", "0", "--repeat", "1", "--trace", "t.json"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("\nbottleneck: (.*)\n"))) << r.out;
  const std::string verdict = m[1];
  const nlohmann::json events = nlohmann::json::parse(read_file(path("t.json")));
  // Own time per span name, on the spine's track and on the workers' tracks.
  std::map<std::string, double> spine, workers;
  for (const auto& e : events) {
    if (e["ph"] != "X") continue;
    const int tid = e["tid"];
    if (tid == 1) spine[e["name"]] += e["dur"].get<double>();
    if (tid >= 10) workers[e["name"]] += e["dur"].get<double>();
  }
  ASSERT_FALSE(workers.empty());
  if (verdict.rfind("the consumer", 0) == 0) GTEST_SKIP() << "consumer-bound: " << verdict;
  const std::string none = "none saturated — the busiest, ";
  const std::string node = verdict.rfind(none, 0) == 0
                               ? verdict.substr(none.size(), verdict.find(", is ") - none.size())
                               : verdict.substr(0, verdict.find(" — "));
  const auto& group = verdict.find("in the spine") != std::string::npos ? spine : workers;
  ASSERT_TRUE(group.count(node)) << node << " has no spans where the verdict puts it";
  // The trace covers the first batch too, the verdict only the timed part: nodes within a few
  // percent of each other may swap, so the verdict's node must be within 20% of the busiest.
  double most = 0;
  for (const auto& [name, us] : group) most = std::max(most, us);
  EXPECT_GE(group.at(node), 0.8 * most) << node << " in " << r.out;
}

TEST_F(Cli, RunWritesMetricsAndTraceAndReportPlotsThem) {
  CliResult r =
      run({"run", "p.yaml", "--epochs", "2", "--checkpoint-dir", "ck", "--checkpoint-every", "100",
           "--metrics", "m.jsonl", "--metrics-interval", "0.0002", "--trace", "t.json"});
  ASSERT_EQ(r.status, 0) << r.err;
  // A line every 0.2 ms and one at the end: two lines or more however fast the machine (the
  // run itself takes a few ms; a 5 ms interval gave one line on a fast one).
  const std::vector<std::string> lines = read_lines(path("m.jsonl"));
  ASSERT_GE(lines.size(), 2u);
  std::vector<double> sps;
  std::size_t checkpoints = 0;
  for (const auto& l : lines) {
    const nlohmann::json j = nlohmann::json::parse(l);
    sps.push_back(j["samples_per_s"].get<double>());
    checkpoints += j["checkpoints"].size();
    EXPECT_TRUE(j["busy"].contains("map:random_crop")) << l;
  }
  EXPECT_EQ(checkpoints, 3u);  // steps 100, 200 and the end (250)
  EXPECT_TRUE(nlohmann::json::accept(read_file(path("t.json"))));

  CliResult rep = run({"report", "m.jsonl", "--trace", "t.json", "-o", "report.html"});
  ASSERT_EQ(rep.status, 0) << rep.err;
  const std::string html = read_file(path("report.html"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // no network
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // The throughput series is the metrics file's, value for value.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(html, m, std::regex("data-series='samples_per_s' data-values='([^']*)'")));
  std::istringstream values(m[1].str());
  std::vector<double> plotted;
  for (double v; values >> v;) plotted.push_back(v);
  ASSERT_EQ(plotted.size(), sps.size());
  for (std::size_t i = 0; i < sps.size(); ++i)
    EXPECT_NEAR(plotted[i], sps[i], 1e-5 * sps[i] + 1e-9);
  for (const char* node : {"records", "shuffle", "map:random_crop", "batch"})
    EXPECT_NE(html.find(std::string("data-node='") + node + "'"), std::string::npos) << node;
  std::size_t marks = 0;
  for (std::size_t at = html.find("class='checkpoint'"); at != std::string::npos;
       at = html.find("class='checkpoint'", at + 1))
    ++marks;
  EXPECT_EQ(marks, 3 * checkpoints);  // on each of the three charts
  EXPECT_NE(html.find("<table class='summary'>"), std::string::npos);
  EXPECT_NE(html.find("<table class='trace'>"), std::string::npos);

  CliResult bad = run({"report", "p.yaml", "-o", "x.html"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("p.yaml:1: not a metrics line"), std::string::npos) << bad.err;
}

// ---- run ----

TEST_F(Cli, RanksFromRankAndWorldSizeKeepFilesAndCheckpointsOfTheirOwn) {
  // torchrun-style: RANK and WORLD_SIZE without MPI, the per-rank layout, and {rank} in the
  // paths giving each rank its own digests, provenance and checkpoint directory.
  write_file(dir_ / "r.yaml",
             "seed: 3\nsource: {type: records, paths: \"data/*.bin\", record_bytes: 64}\n"
             "nodes:\n  - shard\n  - shuffle: {mode: global}\n  - batch: {size: 10}\n");
  std::multiset<std::string> records;
  for (int rank : {0, 1}) {
    const std::string r = std::to_string(rank);
    CliResult res =
        testing::run_program("/usr/bin/env",
                             {"RANK=" + r, "WORLD_SIZE=2", testing::cli_path(), "run", "r.yaml",
                              "--checkpoint-dir", "ck/{rank}", "--checkpoint-every", "40",
                              "--digests", "d-{rank}.txt", "--provenance", "p-{rank}.txt"},
                             dir_.str());
    ASSERT_EQ(res.status, 0) << res.err;
    EXPECT_EQ(read_lines(path("d-" + r + ".txt")).size(), 100u);
    const auto prov = read_lines(path("p-" + r + ".txt"));
    ASSERT_EQ(prov.size(), 100u);  // 1000 of the 2000 records, 10 per batch
    for (const auto& line : prov) {
      std::istringstream in(line);
      std::string field;
      for (int f = 0; f < 3; ++f) in >> field;  // step, epoch, index in epoch
      while (in >> field) records.insert(field);
    }
    EXPECT_TRUE(fs::exists(path("ck/" + r + "/" + step_dir(80)))) << res.err;
    EXPECT_TRUE(fs::exists(path("ck/" + r + "/" + step_dir(100)))) << res.err;
  }
  // The two ranks together read every record once.
  EXPECT_EQ(records.size(), 2000u);
  EXPECT_EQ(std::set<std::string>(records.begin(), records.end()).size(), 2000u);
}

TEST_F(Cli, RunWritesDigestsAndProvenanceOfEveryBatch) {
  CliResult r =
      run({"run", "p.yaml", "--steps", "30", "--digests", "d.txt", "--provenance", "prov.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = read_lines(path("d.txt"));
  EXPECT_EQ(lines, expected_digests(30));
  const std::regex line_format("^[0-9]+ [0-9]+ [0-9]+ [0-9a-f]{16}$");
  for (const auto& l : lines) EXPECT_TRUE(std::regex_match(l, line_format)) << l;

  const auto prov = read_lines(path("prov.txt"));
  ASSERT_EQ(prov.size(), 30u);
  Loader loader(from_yaml_file(path("p.yaml")), {.epochs = 2});
  for (const auto& l : prov) {
    auto b = loader.next();
    ASSERT_TRUE(b);
    std::string want = std::to_string(b->info.step) + " " + std::to_string(b->info.epoch) + " " +
                       std::to_string(b->info.index_in_epoch);
    for (const auto& ref : b->info.refs) want += " " + ref.to_string();
    EXPECT_EQ(l, want);
  }
  EXPECT_NE(r.err.find("run finished (reached --steps 30): 30 batches, steps 0..29, epoch 0, "
                       "480 samples, 19.20 kB in "),
            std::string::npos)
      << r.err;
}

// --workers inline: each batch made on the run's own thread; the same batches, and a
// checkpoint of an inline run resumes with workers (and the other way round).
TEST_F(Cli, RunWithWorkersInlineMakesTheSameBatches) {
  CliResult r = run({"run", "p.yaml", "--steps", "40", "--workers", "inline", "--checkpoint-dir",
                     "ck", "--checkpoint-every", "20", "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_lines(path("d.txt")), expected_digests(40));
  r = run({"run", "p.yaml", "--steps", "60", "--workers", "3", "--checkpoint-dir", "ck", "--resume",
           "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(by_step(read_lines(path("d.txt"))), expected_digests(60));
  r = run({"run", "p.yaml", "--steps", "80", "--workers", "inline", "--checkpoint-dir", "ck",
           "--resume", "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(by_step(read_lines(path("d.txt"))), expected_digests(80));
  r = run({"run", "p.yaml", "--steps", "5", "--workers", "some"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--workers expects a number of workers (1 to 1024), auto or inline, got "
                       "'some'"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(run({"run", "p.yaml", "--steps", "5", "--workers", "0"}).status, 2);
}

TEST_F(Cli, ResumingAfterALineCutByAKillKeepsEveryLineWhole) {
  CliResult r = run({"run", "p.yaml", "--steps", "40", "--checkpoint-dir", "ck",
                     "--checkpoint-every", "20", "--digests", "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  // A SIGKILL in the middle of a line's write leaves part of it (longer than a page here, so
  // the search for the last whole line reads more than one block) and no newline.
  fs::remove_all(path("ck/" + step_dir(40)));
  {
    std::ofstream out(path("part.txt"), std::ios::app);
    out << "40 0 40 " << std::string(5000, 'f');
  }
  r = run({"run", "p.yaml", "--steps", "60", "--checkpoint-dir", "ck", "--resume", "--digests",
           "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("--digests part.txt: dropped a last line a killed run left cut short"),
            std::string::npos)
      << r.err;
  const auto lines = read_lines(path("part.txt"));
  EXPECT_EQ(lines.size(), 40u + 40u);  // steps 20..39 again after the resume from step 20
  EXPECT_EQ(by_step(lines), expected_digests(60));
  // A file that ends in a whole line is left as it is.
  r = run({"run", "p.yaml", "--steps", "60", "--checkpoint-dir", "ck", "--resume", "--digests",
           "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("dropped a last line"), std::string::npos) << r.err;
  EXPECT_EQ(read_lines(path("part.txt")), lines);
}

TEST_F(Cli, RunToTheEndOfTheDataAndReportProgress) {
  CliResult r = run({"run", "p.yaml", "--digests", "-", "--progress-interval", "0"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, [&] {
    std::string s;
    for (const auto& l : expected_digests(1000)) s += l + "\n";
    return s;
  }());
  EXPECT_NE(r.err.find("run finished (end of data): 250 batches, steps 0..249, epoch 1"),
            std::string::npos)
      << r.err;
  // Not a terminal: a plain line per progress report; 2 epochs of 125 batches are known.
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("flowstate: step 249  epoch 1  [0-9.]+ [kMG]?samples/s  [0-9.]+ "
                        "[kMG]?B/s  100\\.0%  ETA 0s\n")))
      << r.err;
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex("flowstate: step 124  epoch 0 .*  50\\.0%  ETA ")))
      << r.err;
}

TEST_F(Cli, WorkersAndSeedOverrides) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "20", "--workers", "1", "--digests", "w1.txt"}).status,
            0);
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "20", "--workers", "4", "--digests", "w4.txt"}).status,
            0);
  ASSERT_EQ(
      run({"run", "p.yaml", "--steps", "20", "--set", "seed=22", "--digests", "s.txt"}).status, 0);
  EXPECT_EQ(read_lines(path("w1.txt")), read_lines(path("w4.txt")));
  EXPECT_NE(read_lines(path("w1.txt")), read_lines(path("s.txt")));
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "300", "--epochs", "1", "--digests", "e.txt"}).status,
            0);
  EXPECT_EQ(read_lines(path("e.txt")).size(), 125u);
}

TEST_F(Cli, AResumedRunEqualsAnUninterruptedOne) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "160", "--digests", "full.txt"}).status, 0);
  CliResult r = run({"run", "p.yaml", "--steps", "137", "--checkpoint-dir", "ck",
                     "--checkpoint-every", "20", "--digests", "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  // A checkpoint after each batch whose (step + 1) % 20 == 0, and one at the end.
  for (int k : {20, 40, 60, 80, 100, 120})
    EXPECT_NE(r.err.find("flowstate: checkpoint ck/" + step_dir(k) + "\n"), std::string::npos)
        << k << "\n"
        << r.err;
  EXPECT_NE(r.err.find("flowstate: checkpoint ck/step-000000000137\n"), std::string::npos);
  // Resume from the last periodic checkpoint, as after a crash: steps 120..136 run again.
  fs::remove_all(path("ck/step-000000000137"));
  r = run({"run", "p.yaml", "--steps", "160", "--checkpoint-dir", "ck", "--resume", "--digests",
           "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-000000000120: continuing with step 120\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read_lines(path("part.txt")).size(), 137u + 40u);
  EXPECT_EQ(by_step(read_lines(path("part.txt"))), read_lines(path("full.txt")));
  // --steps is a global target: resuming at it runs nothing.
  r = run({"run", "p.yaml", "--steps", "160", "--checkpoint-dir", "ck", "--resume", "--digests",
           "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("run finished (already at --steps 160): 0 batches"), std::string::npos)
      << r.err;
  EXPECT_EQ(read_lines(path("part.txt")).size(), 177u);
}

TEST_F(Cli, ResumeSkipsCorruptCheckpointsAndSaysWhy) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "30", "--checkpoint-dir", "ck", "--checkpoint-every",
                 "10", "--keep", "2"})
                .status,
            0);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(path("ck")))
    if (e.path().filename().string().rfind("step-", 0) == 0)
      steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"step-000000000020", "step-000000000030"}));
  // Flip a byte of the newest state.
  std::string state = read_file(path("ck/step-000000000030/state.bin"));
  state[state.size() / 2] ^= 1;
  write_file(path("ck/step-000000000030/state.bin"), state);
  CliResult r = run({"run", "p.yaml", "--steps", "40", "--checkpoint-dir", "ck", "--resume",
                     "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: skipped checkpoint ck/step-000000000030: "
                       "'ck/step-000000000030/state.bin' is corrupt: its XXH3-64 checksum is "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-000000000020: continuing with step 20\n"),
            std::string::npos);
  auto want = expected_digests(40);
  EXPECT_EQ(read_lines(path("d.txt")), std::vector<std::string>(want.begin() + 20, want.end()));
}

TEST_F(Cli, ResumeWithoutACheckpointStartsFresh) {
  CliResult r = run({"run", "p.yaml", "--steps", "3", "--checkpoint-dir", "ck", "--resume",
                     "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: no checkpoint in 'ck'; starting from the beginning\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read_lines(path("d.txt")), expected_digests(3));
}

TEST_F(Cli, ResumeRefusesDataThatChangedSinceTheCheckpoint) {
  // The reproduction: three record files, a checkpointed run, one file deleted.
  fs::create_directories(path("three"));
  ASSERT_EQ(run_cli({"gen", "records", "--out", "data", "--records", "600", "--record-bytes", "64",
                     "--shards", "3"},
                    path("three"))
                .status,
            0);
  write_file(path("three/p.yaml"), kPipeline);
  CliResult r = run_cli(
      {"run", "p.yaml", "--steps", "20", "--checkpoint-dir", "ck", "--checkpoint-every", "10"},
      path("three"));
  ASSERT_EQ(r.status, 0) << r.err;
  fs::remove(path("three/data/part-00002.bin"));
  r = run_cli({"run", "p.yaml", "--steps", "40", "--checkpoint-dir", "ck", "--resume"},
              path("three"));
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_EQ(r.err,
            "flowstate: error: cannot restore ck/step-000000000020: records: "
            "data/part-00002.bin was in the checkpoint and is gone\n(only files were added or "
            "removed: to continue over them, opt in with `flowstate run --data-changed continue`, "
            "LoaderOptions::on_data_change or load_state_dict(state, data_changed=\"continue\")) "
            "[file ck/step-000000000020/state.bin]\n");
}

TEST_F(Cli, ResumeRefusesCheckpointsThatAllFailToVerify) {
  // Starting over silently would train on the same data again.
  fs::create_directories(path("ck/step-000000000005"));
  CliResult r = run({"run", "p.yaml", "--steps", "3", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 4);
  EXPECT_EQ(r.err,
            "flowstate: error: no checkpoint under 'ck' verifies:\n"
            "  ck/step-000000000005: 'ck/step-000000000005/MANIFEST.json' is missing: the "
            "checkpoint is incomplete\n");
}

TEST_F(Cli, ResumeRefusesALatestWithoutItsCheckpoint) {
  fs::create_directories(path("ck"));
  write_file(path("ck/LATEST"), "step-000000007700\n");
  CliResult r = run({"run", "p.yaml", "--steps", "3", "--checkpoint-dir", "ck", "--resume",
                     "--digests", "d.txt"});
  EXPECT_EQ(r.status, 4);
  EXPECT_EQ(r.err,
            "flowstate: error: no checkpoint under 'ck' verifies:\n"
            "  ck/LATEST: 'ck/LATEST' names 'ck/step-000000007700', which does not exist\n");
  EXPECT_TRUE(read_lines(path("d.txt")).empty());  // not one batch
}

TEST_F(Cli, ANewerValidStepWinsOverAnOlderLatest) {
  ASSERT_EQ(
      run({"run", "p.yaml", "--steps", "30", "--checkpoint-dir", "ck", "--checkpoint-every", "10"})
          .status,
      0);
  write_file(path("ck/LATEST"), "step-000000000010\n");
  CliResult r = run({"run", "p.yaml", "--steps", "40", "--checkpoint-dir", "ck", "--resume",
                     "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-000000000030: continuing with step 30\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("skipped checkpoint"), std::string::npos) << r.err;
  auto want = expected_digests(40);
  EXPECT_EQ(read_lines(path("d.txt")), std::vector<std::string>(want.begin() + 30, want.end()));
}

TEST_F(Cli, AFreshRunRefusesADirectoryThatHoldsCheckpoints) {
  ASSERT_EQ(
      run({"run", "p.yaml", "--steps", "77", "--checkpoint-dir", "ck", "--checkpoint-every", "10"})
          .status,
      0);
  const auto before = names_in(path("ck"));
  CliResult r = run({"run", "p.yaml", "--steps", "10", "--checkpoint-dir", "ck", "--keep", "3",
                     "--digests", "d.txt"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: ck holds checkpoints up to step 77; pass --resume to continue or "
            "--overwrite to discard them\n");
  EXPECT_EQ(names_in(path("ck")), before);  // untouched
  EXPECT_TRUE(read_lines(path("d.txt")).empty());
  // --overwrite discards them first; the run then owns the directory.
  r = run({"run", "p.yaml", "--steps", "25", "--checkpoint-dir", "ck", "--checkpoint-every", "10",
           "--keep", "3", "--overwrite", "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: discarded the checkpoints in 'ck' (--overwrite)\n"),
            std::string::npos)
      << r.err;
  // (.run.lock: the run's hold on the directory, kept like the writers' .lock.)
  EXPECT_EQ(names_in(path("ck")),
            (std::set<std::string>{".lock", ".run.lock", "LATEST", step_dir(10), step_dir(20),
                                   step_dir(25)}));
  EXPECT_EQ(read_lines(path("d.txt")), expected_digests(25));
  r = run({"run", "p.yaml", "--steps", "30", "--checkpoint-dir", "ck", "--resume"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from ck/step-000000000025"), std::string::npos) << r.err;
  // --overwrite on an empty or missing directory is simply a fresh run.
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "3", "--checkpoint-dir", "new", "--overwrite"}).status,
            0);
  r = run({"run", "p.yaml", "--checkpoint-dir", "ck", "--resume", "--overwrite"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --resume and --overwrite exclude each other (see 'flowstate run "
            "--help')\n");
}

TEST_F(Cli, AFailingAsyncCheckpointStopsTheRunAtTheNextBatch) {
  // The checkpoint directory is reached through a link that is swapped, atomically, for one
  // to a file once the run has checkpointed: the next write fails with ENOTDIR (as root too,
  // where a read-only directory would not fail).
  fs::create_directories(path("real"));
  write_file(path("afile"), "x");
  fs::create_directory_symlink("real", path("link"));
  CliProcess p({"run", "p.yaml", "--epochs", "0", "--checkpoint-dir", "link/ck",
                "--checkpoint-every", "500", "--digests", "d.txt"},
               dir_.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(path("real/ck/step-000000000500"))) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no checkpoint written";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  fs::create_symlink("afile", path("link.new"));
  fs::rename(path("link.new"), path("link"));
  CliResult r = p.wait();
  EXPECT_EQ(r.status, 4) << r.err;
  // (Usually the next write's mkdir of link/ck fails; a write under way at the swap fails
  // at its next file.)
  const std::regex failed(
      "flowstate: error: checkpoint 'link/ck/step-([0-9]{12})' failed: cannot [a-z ]+ "
      "'link/ck[^']*': Not a directory\n");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, failed)) << r.err;
  // It stopped by the next checkpoint at the latest (usually at the first batch after the
  // write failed; when a loaded machine delays the writer thread, the consumer may get further:
  // LoaderCheckpoints.AFailedAsyncSaveSurfacesAtTheNextBatch checks that timing exactly).
  const std::uint64_t failed_step = std::stoull(m[1]);
  EXPECT_LE(std::stoull(read_lines(path("d.txt")).back()), failed_step + 499);
}

TEST_F(Cli, SkippedRangesAreDroppedAndRemembered) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "12", "--skip", "3:5", "--skip", "9:9",
                 "--checkpoint-dir", "ck", "--digests", "d.txt"})
                .status,
            0);
  std::vector<std::string> want;
  for (const auto& l : expected_digests(12)) {
    const int step = std::stoi(l);
    if (!(step >= 3 && step <= 5) && step != 9) want.push_back(l);
  }
  EXPECT_EQ(read_lines(path("d.txt")), want);
  // The same command line resumed: the ranges are in the state already.
  CliResult r = run({"run", "p.yaml", "--steps", "14", "--skip", "3:5", "--skip", "9:9",
                     "--checkpoint-dir", "ck", "--resume", "--digests", "d.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_lines(path("d.txt")).size(), want.size() + 2);
  CliResult i = run({"inspect", "ck", "--json"});
  ASSERT_EQ(i.status, 0) << i.err;
  auto j = nlohmann::json::parse(i.out);
  EXPECT_EQ(j["skipped_steps"], nlohmann::json::parse("[[3, 5], [9, 9]]"));
  // A range that was already delivered cannot be skipped.
  r = run(
      {"run", "p.yaml", "--steps", "20", "--skip", "10:11", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("flowstate: error: skip range 10:11 starts at or before step 13, which "
                       "was already delivered"),
            std::string::npos)
      << r.err;
}

/// Runs the pipeline forever in the background until its digests file has `lines` lines.
void wait_for_lines(const std::string& file, std::size_t lines) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (read_lines(file).size() < lines) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress in " << file;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void interrupt_and_resume(const std::string& dir, int sig) {
  // Epochs 0: the run cannot end by itself; every checkpoint is fsynced, which keeps it slow
  // enough to be stopped mid-run.
  const std::vector<std::string> common{
      "run", "p.yaml",    "--epochs", "0", "--checkpoint-dir", "ck", "--checkpoint-every",
      "7",   "--digests", "int.txt"};
  CliProcess p(common, dir);
  wait_for_lines(dir + "/int.txt", 40);
  p.signal(sig);
  CliResult r = p.wait();
  // The conventional 128 + signal (143, 130), so a scheduler sees a preempted run.
  ASSERT_EQ(r.status, 128 + sig) << r.err;
  const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  ASSERT_NE(r.err.find("run finished (interrupted by " + name + ")"), std::string::npos) << r.err;
  const auto before = read_lines(dir + "/int.txt");
  const std::uint64_t last = std::stoull(before.back());
  // The final checkpoint is the last delivered batch.
  char ck[64];
  std::snprintf(ck, sizeof(ck), "flowstate: checkpoint ck/step-%012llu\n",
                static_cast<unsigned long long>(last + 1));
  EXPECT_NE(r.err.find(ck), std::string::npos) << r.err;

  std::vector<std::string> resume = common;
  resume.insert(resume.end(), {"--resume", "--steps", std::to_string(last + 60)});
  r = run_cli(resume, dir);
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> uninterrupted{"run",       "p.yaml",  "--epochs",
                                         "0",         "--steps", std::to_string(last + 60),
                                         "--digests", "ref.txt"};
  ASSERT_EQ(run_cli(uninterrupted, dir).status, 0);
  // Not one batch repeated or lost.
  EXPECT_EQ(read_lines(dir + "/int.txt"), read_lines(dir + "/ref.txt"));
}

TEST_F(Cli, SigtermMidRunThenResumeEqualsAnUninterruptedRun) {
  interrupt_and_resume(dir_.str(), SIGTERM);
}

TEST_F(Cli, SigintStopsCleanlyToo) { interrupt_and_resume(dir_.str(), SIGINT); }

// ---- errors: exit status and message ----

TEST_F(Cli, ConfigurationErrorsExitWith2AndNameFileLineAndKey) {
  std::string bad = kPipeline;
  bad.replace(bad.find("size: 300"), 9, "size: 0");
  write_file(path("bad.yaml"), bad);
  CliResult r = run({"run", "bad.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: bad.yaml:4:35: nodes[0].shuffle.size: 0 is out of range (must "
            "be at least 1)\n");
  r = run({"validate", "missing.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: cannot read pipeline 'missing.yaml': No such file or directory\n");
}

TEST_F(Cli, DataErrorsExitWith3AndNameTheFileAndOffset) {
  CliResult r = run({"run", "p.yaml", "--set", "source.record_bytes=48"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err,
            "flowstate: error: size of 'data/part-00000.bin' (32000 bytes) is not a multiple of "
            "record_bytes (48) [offset 31968]\n");
}

TEST_F(Cli, AMapThatFailsOnARecordIsADataErrorWith3) {
  // Found when the first sample is cropped: the record is too short for the crop. It names
  // the node, the value that asked for it and the record, and exits 3 as data errors do.
  CliResult r = run({"run", "p.yaml", "--set", "nodes[1].map.length=100"});
  EXPECT_EQ(r.status, 3);
  EXPECT_TRUE(std::regex_match(
      r.err,
      std::regex("flowstate: error: node 'random_crop': --set nodes\\[1\\]\\.map\\.length=100: "
                 "nodes\\[1\\]\\.map\\.length: needs 100 rows, but field 'data' has shape "
                 "\\[64\\] in record 0:[0-9]+\n")))
      << r.err;
  // A decode whose shape does not fit the 64-byte records, written in the YAML.
  write_file(path("decode.yaml"),
             "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"
             "nodes:\n"
             "  - map: {fn: decode, dtype: uint16, shape: [3, 7]}\n"
             "  - batch: {size: 16}\n");
  r = run({"run", "decode.yaml"});
  EXPECT_EQ(r.status, 3);
  EXPECT_TRUE(std::regex_match(
      r.err, std::regex("flowstate: error: node 'decode': decode\\.yaml:3:45: "
                        "nodes\\[0\\]\\.map\\.shape: field 'data' holds 64 bytes per sample, "
                        "but uint16 \\[3, 7\\] needs 42 bytes \\(in record 0:[0-9]+\\)\n")))
      << r.err;
}

TEST_F(Cli, CheckpointErrorsExitWith4AndSayWhatDiffers) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "5", "--checkpoint-dir", "ck"}).status, 0);
  CliResult r = run({"run", "p.yaml", "--steps", "10", "--checkpoint-dir", "ck", "--resume",
                     "--set", "nodes[2].batch.size=8"});
  EXPECT_EQ(r.status, 4);
  EXPECT_NE(r.err.find("flowstate: error: "), std::string::npos);
  EXPECT_NE(r.err.find("batch.size: 16 in checkpoint, 8 now"), std::string::npos) << r.err;
  r = run({"inspect", "nowhere"});
  EXPECT_EQ(r.status, 4);
  EXPECT_EQ(r.err, "flowstate: error: 'nowhere' does not exist\n");
}

TEST_F(Cli, UsageErrorsExitWith2) {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const std::vector<Case> cases = {
      {{"run", "p.yaml", "--bogus"},
       "flowstate: error: unknown option '--bogus' (see 'flowstate run --help')\n"},
      {{"run", "p.yaml", "--steps"},
       "flowstate: error: --steps needs a value (see 'flowstate run --help')\n"},
      {{"run", "p.yaml", "--steps", "ten"},
       "flowstate: error: --steps expects a non-negative integer, got 'ten' (see 'flowstate "
       "run --help')\n"},
      {{"run", "p.yaml", "--resume"},
       "flowstate: error: --resume needs a checkpoint directory (--checkpoint-dir, or "
       "checkpoint.dir in the pipeline) (see 'flowstate run --help')\n"},
      {{"run", "p.yaml", "--skip", "5:3"},
       "flowstate: error: --skip 5:3 is reversed (A > B) (see 'flowstate run --help')\n"},
      {{"run"},
       "flowstate: error: expected one pipeline file, got 0 arguments (see 'flowstate "
       "run --help')\n"},
      {{"verify", "p.yaml"},
       "flowstate: error: --steps is required (see 'flowstate verify --help')\n"},
      {{"frobnicate"}, "flowstate: error: unknown command 'frobnicate'\n"},
  };
  for (const auto& c : cases) {
    CliResult r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.args[0];
    if (c.args[0] == "frobnicate")
      EXPECT_NE(r.err.find(c.err), std::string::npos) << r.err;
    else
      EXPECT_EQ(r.err, c.err);
  }
  EXPECT_EQ(run({}).status, 2);
}

TEST_F(Cli, EveryCommandHasHelp) {
  for (const char* c : {"gen", "run", "validate", "inspect", "verify", "schema"}) {
    CliResult r = run({c, "--help"});
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_EQ(r.out.rfind(std::string("usage: flowstate ") + c, 0), 0u) << r.out;
  }
  CliResult r = run({"--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* c : {"gen", "run", "validate", "inspect", "verify", "bench", "schema"})
    EXPECT_NE(r.out.find(std::string("\n  ") + c + " "), std::string::npos) << c;
}

// ---- inspect ----

TEST_F(Cli, InspectJsonOfAPathThatIsNotUtf8IsValidJsonWithReplacementCharacters) {
  // A data directory named in Latin-1 ("d\xe9"): the run works on the bytes; inspect's JSON
  // shows each byte outside UTF-8 as U+FFFD (README: inspect), in the pipeline and node states.
  ASSERT_EQ(run({"gen", "records", "--out", "d\xe9", "--records", "100", "--record-bytes", "8",
                 "--shards", "1"})
                .status,
            0);
  write_file(dir_ / "latin1.yaml",
             "source: {type: records, paths: \"d\xe9/*.bin\", record_bytes: 8}\n"
             "nodes:\n  - batch: {size: 4}\n");
  CliResult r = run({"run", "latin1.yaml", "--steps", "3", "--checkpoint-dir", "ck\xe9"});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run({"inspect", "ck\xe9", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j["path"], "ck\uFFFD/step-000000000003");
  bool found = false;
  for (const auto& p : j["pipeline"])
    if (p["value"] == "d\uFFFD/*.bin") found = true;
  EXPECT_TRUE(found) << j["pipeline"].dump();
  EXPECT_EQ(j["nodes"][0]["state"]["files"][0]["name"], "d\uFFFD/part-00000.bin");
  r = run({"inspect", "ck\xe9"});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(Cli, InspectShowsWhatACheckpointHolds) {
  ASSERT_EQ(run({"run", "p.yaml", "--steps", "130", "--checkpoint-dir", "ck", "--checkpoint-every",
                 "50", "--skip", "128:129"})
                .status,
            0);
  const std::string fingerprint = hex64(from_yaml_file(path("p.yaml")).fingerprint());
  CliResult r = run({"inspect", "ck"});  // the root: its newest checkpoint
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint: ck/step-000000000128\n"
                       "step: 128 (batches consumed; the next batch is step 128)\n"
                       "last delivered: step 127, epoch 1\n"
                       "format version: 1\n"
                       "fingerprint: " +
                       fingerprint + "\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  random_crop.length = 40\n"), std::string::npos);
  EXPECT_NE(r.out.find("skipped steps: 128..129\n"), std::string::npos);
  // The shuffle starts its source's epoch (the file source's state names the epoch its files
  // are read in: a change of its files needs it), so the source is at epoch 1 too.
  EXPECT_NE(r.out.find("node states:\n"
                       "  records (records): epoch 1, cursor 0, files 4 (--json lists them)\n"
                       "  shuffle (shuffle): epoch 1, draws 48, keyframe none\n"
                       "  batch (batch): epoch 1, next_step 128, next_index_in_epoch 3, "
                       "epoch_started true\n"),
            std::string::npos)
      << r.out;

  r = run({"inspect", "ck/step-000000000100", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["step"], 100);
  EXPECT_EQ(j["last_step"], 99);
  EXPECT_EQ(j["last_epoch"], 0);
  EXPECT_EQ(j["fingerprint"], fingerprint);
  ASSERT_EQ(j["nodes"].size(), 3u);
  EXPECT_EQ(j["nodes"][1]["name"], "shuffle");
  EXPECT_EQ(j["nodes"][1]["state"]["draws"], 1600);
  EXPECT_EQ(j["nodes"][1]["state"]["keyframe"]["draws"], 1500);
  EXPECT_EQ(j["nodes"][1]["state"]["keyframe"]["slots"], 300);
  EXPECT_EQ(j["nodes"][2]["state"]["next_step"], 100);
  EXPECT_EQ(j["pipeline"][0]["key"], "seed");
  EXPECT_EQ(j["pipeline"][0]["value"], "21");
  // The data identity: every file by its name below the glob's root.
  const auto& files = j["nodes"][0]["state"]["files"];
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[3]["name"], "data/part-00003.bin");
  EXPECT_EQ(files[3]["bytes"], 500 * 64);
  EXPECT_EQ(files[3]["items"], 500);
  EXPECT_EQ(files[3]["hash"].get<std::string>().size(), 16u);
}

// ---- verify ----

TEST_F(Cli, VerifyProvesExactResume) {
  CliResult r = run({"verify", "p.yaml", "--steps", "140", "--trials", "4", "--seed", "3"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("reference: 140 batches uninterrupted (steps 0..139)\n", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 5);
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("trial 2: checkpoint after [0-9]+ batches \\(step-[0-9]{12}\\), restored "
                        "with 3 workers: [0-9]+ batches identical\n")))
      << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("trial 4: checkpoint after [0-9]+ batches \\(step-[0-9]{12}\\), restored "
                        "inline: [0-9]+ batches identical\n")))
      << r.out;
  EXPECT_EQ(r.err,
            "flowstate: verify ok: 4 restores reproduced the uninterrupted run exactly "
            "(--seed 3)\n");
  // The reference run may be made inline too (or auto); a worker count of 0 is refused.
  r = run({"verify", "p.yaml", "--steps", "40", "--trials", "2", "--workers", "inline"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(run({"verify", "p.yaml", "--steps", "40", "--trials", "2", "--workers", "auto"}).status,
            0);
  EXPECT_EQ(run({"verify", "p.yaml", "--steps", "4", "--workers", "0"}).status, 2);
}

TEST_F(Cli, SchemaListsEveryNodeAndTransform) {
  CliResult r = run({"schema"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* n : {"shard", "shuffle", "map", "batch", "prefetch", "device_copy"})
    EXPECT_NE(r.out.find("\n" + std::string(n) + ": "), std::string::npos) << n;
  EXPECT_NE(r.out.find("\nrecords (a source: `source: {type: records, ...}`): "),
            std::string::npos);
  for (const char* t : {"decode", "cast", "normalize", "slice", "random_crop"})
    EXPECT_NE(r.out.find("\nmap fn: " + std::string(t)), std::string::npos) << t;
  EXPECT_NE(r.out.find("  size (an unsigned integer, default 16384, >= 1): buffer mode: slots in "
                       "the shuffle buffer\n"),
            std::string::npos)
      << r.out;
  // Data parameters (a resume may continue over them, --data-changed continue) are marked.
  r = run({"schema", "mix"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(", required, data): one positive number per input\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(", required, data): input pipeline files"), std::string::npos) << r.out;
  const auto stop = r.out.find("\n  stop (");
  ASSERT_NE(stop, std::string::npos) << r.out;
  EXPECT_EQ(r.out.substr(stop, r.out.find('\n', stop + 1) - stop).find(", data)"),
            std::string::npos);
  r = run({"schema", "nope"});
  EXPECT_EQ(r.status, 2);
}

}  // namespace
}  // namespace flowstate
