// `flowstate run` over changed data (issue 25): --data-changed continue on a resume, and mix
// weights set while running from --mix-weights / --weights-schedule, through a real process
// killed with SIGKILL and resumed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::CliProcess;
using testing::CliResult;
using testing::read_lines;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

/// A mix of two inputs over 2000 records of 16 bytes in 4 shards; batches of 4.
class CliDataChange : public ::testing::Test {
 protected:
  void SetUp() override {
    CliResult r = run({"gen", "records", "--out", "data", "--records", "2000", "--record-bytes",
                       "16", "--shards", "4"});
    ASSERT_EQ(r.status, 0) << r.err;
    write_file(dir_ / "in_a.yaml",
               "seed: 1\nsource: {type: records, paths: 'data/part-0000[01].bin', "
               "record_bytes: 16}\nnodes:\n  - shuffle: {mode: global}\n");
    write_file(dir_ / "in_b.yaml",
               "seed: 2\nsource: {type: records, paths: 'data/part-0000[23].bin', "
               "record_bytes: 16}\nnodes:\n  - shuffle: {mode: global}\n");
    write_file(dir_ / "in_c.yaml",
               "seed: 3\nsource: {type: records, paths: 'data/part-00000.bin', "
               "record_bytes: 16}\n");
    write_file(dir_ / "mix.yaml", pipeline("[in_a.yaml, in_b.yaml]", "[1, 1]"));
  }
  static std::string pipeline(const std::string& inputs, const std::string& weights) {
    return "seed: 9\nsource: {type: mix, inputs: " + inputs + ", weights: " + weights +
           ", stop: cycle}\nnodes:\n  - batch: {size: 4}\nepochs: 0\n";
  }
  CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  std::string path(const std::string& name) const { return dir_ / name; }

  TempDir dir_;
};

TEST_F(CliDataChange, AResumeOverNewWeightsNeedsTheOptInAndIsRecorded) {
  CliResult r = run({"run", "mix.yaml", "--steps", "30", "--checkpoint-dir", "ck",
                     "--checkpoint-every", "10", "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  write_file(path("mix.yaml"), pipeline("[in_a.yaml, in_b.yaml, in_c.yaml]", "[1, 3, 1]"));
  r = run({"run", "mix.yaml", "--steps", "60", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("mix.weights: [1, 1] in checkpoint, [1, 3, 1] now"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--data-changed continue"), std::string::npos) << r.err;
  r = run({"run", "mix.yaml", "--steps", "60", "--checkpoint-dir", "ck", "--resume",
           "--data-changed", "continue", "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("data change at step 30: mix.weights: [1, 1] in checkpoint, [1, 3, 1] "
                       "now; mix.inputs[2]: absent in checkpoint"),
            std::string::npos)
      << r.err;
  // The provenance has it, between steps 29 and 30.
  const auto lines = read_lines(path("p.txt"));
  ASSERT_EQ(lines.size(), 61u);
  EXPECT_TRUE(lines[30].starts_with("# data change at step 30: ")) << lines[30];
  EXPECT_TRUE(lines[31].starts_with("30 ")) << lines[31];
  // inspect shows the history.
  r = run({"inspect", "ck"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data changes:\n  step 30: mix.weights: [1, 1] in checkpoint, [1, 3, 1] "
                       "now\n      mix.inputs[2]: absent in checkpoint"),
            std::string::npos)
      << r.out;
  // A structural change is refused with the opt-in too, naming it.
  std::string bigger = pipeline("[in_a.yaml, in_b.yaml, in_c.yaml]", "[1, 3, 1]");
  bigger.replace(bigger.find("size: 4"), 7, "size: 8");
  write_file(path("mix.yaml"), bigger);
  r = run({"run", "mix.yaml", "--steps", "70", "--checkpoint-dir", "ck", "--resume",
           "--data-changed", "continue"});
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("batch.size: 4 in checkpoint, 8 now"), std::string::npos) << r.err;
  r = run({"run", "mix.yaml", "--data-changed", "maybe", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 2) << r.err;
}

TEST_F(CliDataChange, WeightsSetAt100And250KilledAfter300ResumeByteIdentically) {
  write_file(path("weights.txt"), "# step:node=weights\n100:mix=1,5\n250:mix=4,1  # later\n");
  CliResult r = run({"run", "mix.yaml", "--steps", "500", "--weights-schedule", "weights.txt",
                     "--digests", "full.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto full = read_lines(path("full.txt"));
  ASSERT_EQ(full.size(), 500u);
  // The same with --mix-weights, and without weights: the weights changed the draws.
  r = run({"run", "mix.yaml", "--steps", "500", "--mix-weights", "250:mix=4,1", "--mix-weights",
           "100:mix=1,5", "--digests", "flags.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_lines(path("flags.txt")), full);
  r = run({"run", "mix.yaml", "--steps", "500", "--digests", "plain.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto plain = read_lines(path("plain.txt"));
  EXPECT_EQ(std::vector<std::string>(plain.begin(), plain.begin() + 100),
            std::vector<std::string>(full.begin(), full.begin() + 100));
  EXPECT_NE(plain, full);

  // A run that never ends by itself, killed with SIGKILL right after its checkpoint of step
  // 300, then resumed from it. Its digests go through a FIFO of one page that this test reads
  // up to step 299: the run blocks on it some 150 steps later, before its next checkpoint.
  const std::string fifo = path("part.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  ASSERT_GE(::fcntl(fd, F_SETPIPE_SZ, 4096), 0);
  std::vector<std::string> killed_lines;
  {
    CliProcess killed({"run", "mix.yaml", "--checkpoint-dir", "ck", "--checkpoint-every", "300",
                       "--weights-schedule", "weights.txt", "--digests", "part.fifo"},
                      dir_.str());
    std::string pending;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (killed_lines.size() < 300 && std::chrono::steady_clock::now() < deadline) {
      char buf[256];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      pending.append(buf, static_cast<std::size_t>(n));
      for (auto nl = pending.find('\n'); nl != std::string::npos && killed_lines.size() < 300;
           nl = pending.find('\n')) {
        killed_lines.push_back(pending.substr(0, nl));
        pending.erase(0, nl + 1);
      }
    }
    ASSERT_EQ(killed_lines.size(), 300u);
    while (!fs::exists(path("ck/step-000000000300")) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_FALSE(killed.exited());
    killed.signal(SIGKILL);
    EXPECT_EQ(killed.wait().status, 128 + SIGKILL);
  }
  ::close(fd);
  EXPECT_EQ(killed_lines, std::vector<std::string>(full.begin(), full.begin() + 300));
  ASSERT_TRUE(fs::exists(path("ck/step-000000000300")));
  ASSERT_FALSE(fs::exists(path("ck/step-000000000600")));
  r = run({"run", "mix.yaml", "--steps", "500", "--checkpoint-dir", "ck", "--resume",
           "--weights-schedule", "weights.txt", "--digests", "part.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from ck/step-000000000300"), std::string::npos) << r.err;
  // The resume recorded nothing new: the weights in force came with the state.
  EXPECT_EQ(r.err.find("data change at step"), std::string::npos) << r.err;
  EXPECT_EQ(read_lines(path("part.txt")), std::vector<std::string>(full.begin() + 300, full.end()));
  r = run({"inspect", "ck", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("weights [1, 1] -> [1, 5] (set while running)"), std::string::npos);
  EXPECT_NE(r.out.find("weights [1, 5] -> [4, 1] (set while running)"), std::string::npos);
}

TEST_F(CliDataChange, ABadScheduleIsAUsageErrorNamingItsLine) {
  write_file(path("w.txt"), "100:mix=1,5\n200:mix=1;5\n");
  CliResult r = run({"run", "mix.yaml", "--steps", "5", "--weights-schedule", "w.txt"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("w.txt:2: '1;5' in '200:mix=1;5' is not a number"), std::string::npos)
      << r.err;
  r = run({"run", "mix.yaml", "--steps", "5", "--mix-weights", "1:nope=1,1"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("'nope' is not a mix node"), std::string::npos) << r.err;
}

/// The refs of provenance lines (`<step> <epoch> <index> <source>:<index>...`) of `epoch`,
/// as record numbers, in order.
std::vector<std::uint64_t> provenance_refs(const std::vector<std::string>& lines,
                                           std::uint64_t epoch) {
  std::vector<std::uint64_t> out;
  for (const auto& line : lines) {
    if (line.starts_with("#")) continue;
    std::istringstream in(line);
    std::uint64_t step = 0, e = 0, index = 0;
    in >> step >> e >> index;
    if (e != epoch) continue;
    std::string ref;
    while (in >> ref) out.push_back(std::stoull(ref.substr(ref.find(':') + 1)));
  }
  return out;
}

/// The lines of `epoch` without their step (`<epoch> <index> <refs>`).
std::vector<std::string> without_steps(const std::vector<std::string>& lines, std::uint64_t epoch) {
  std::vector<std::string> out;
  for (const auto& line : lines) {
    if (line.starts_with("#")) continue;
    const std::string rest = line.substr(line.find(' ') + 1);
    if (rest.starts_with(std::to_string(epoch) + " ")) out.push_back(rest);
  }
  return out;
}

/// A source over `data/part-*.bin` (4 files of 500 records), globally shuffled or not, batches
/// of 4, two epochs.
std::string glob_pipeline(bool shuffle) {
  return std::string(
             "seed: 4\nsource: {type: records, paths: 'data/part-*.bin', record_bytes: "
             "16}\nnodes:\n") +
         (shuffle ? "  - shuffle: {mode: global}\n" : "") + "  - batch: {size: 4}\nepochs: 2\n";
}

TEST_F(CliDataChange, AFileAddedToTheGlobWaitsForTheNextEpoch) {
  write_file(path("glob.yaml"), glob_pipeline(true));
  CliResult r = run({"run", "glob.yaml", "--provenance", "full.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto full = read_lines(path("full.txt"));
  ASSERT_EQ(full.size(), 1000u);
  r = run({"run", "glob.yaml", "--steps", "100", "--checkpoint-dir", "ck", "--checkpoint-every",
           "50", "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  // A fifth file: records 2000..2499 (shard 4 of a data set of 2500 in 5).
  r = run({"gen", "records", "--out", "more", "--records", "2500", "--record-bytes", "16",
           "--shards", "5"});
  ASSERT_EQ(r.status, 0) << r.err;
  fs::copy_file(path("more/part-00004.bin"), path("data/part-00004.bin"));

  r = run({"run", "glob.yaml", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("records: data/part-00004.bin is new (not in the checkpoint)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--data-changed continue"), std::string::npos) << r.err;

  r = run({"run", "glob.yaml", "--checkpoint-dir", "ck", "--checkpoint-every", "50", "--resume",
           "--data-changed", "continue", "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string note =
      "data change at step 100: records: data/part-00004.bin added (500 records): epoch 0 "
      "finishes over the 4 files it started with, epoch 1 reads 5";
  EXPECT_NE(r.err.find(note), std::string::npos) << r.err;
  const auto lines = read_lines(path("p.txt"));
  ASSERT_EQ(lines.size(), 500u + 1 + 625u);
  EXPECT_EQ(lines[100], "# " + note);
  // Epoch 0: the uninterrupted run's, line for line (the file came last: numbers unchanged),
  // so every record of the four files once.
  std::vector<std::string> epoch0(lines.begin(), lines.begin() + 100);
  epoch0.insert(epoch0.end(), lines.begin() + 101, lines.begin() + 501);
  EXPECT_EQ(epoch0, std::vector<std::string>(full.begin(), full.begin() + 500));
  auto refs = provenance_refs(lines, 0);
  std::sort(refs.begin(), refs.end());
  ASSERT_EQ(refs.size(), 2000u);
  for (std::uint64_t i = 0; i < 2000; ++i) ASSERT_EQ(refs[i], i);
  // Epoch 1: a fresh run's over the five files.
  r = run({"run", "glob.yaml", "--provenance", "fresh.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(without_steps(lines, 1), without_steps(read_lines(path("fresh.txt")), 1));
  // inspect shows the history.
  r = run({"inspect", "ck"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data changes:\n  step 100: records: data/part-00004.bin added"),
            std::string::npos)
      << r.out;
}

TEST_F(CliDataChange, AFileRemovedFromTheGlobHasItsUnreadRecordsSkipped) {
  write_file(path("seq.yaml"), glob_pipeline(false));
  CliResult r = run({"run", "seq.yaml", "--steps", "150", "--checkpoint-dir", "ck",
                     "--checkpoint-every", "150", "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  // 600 records read: part-00001.bin (records 500..999) up to its 100th.
  fs::remove(path("data/part-00001.bin"));
  r = run({"run", "seq.yaml", "--checkpoint-dir", "ck", "--resume"});
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("records: data/part-00001.bin was in the checkpoint and is gone"),
            std::string::npos)
      << r.err;
  r = run({"run", "seq.yaml", "--checkpoint-dir", "ck", "--resume", "--data-changed", "continue",
           "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("data change at step 150: records: data/part-00001.bin removed: 400 "
                       "records of its 500 not yet read in epoch 0 are skipped"),
            std::string::npos)
      << r.err;
  const auto lines = read_lines(path("p.txt"));
  // Records are numbered as the files now number them: part-00002.bin's first is 500.
  const auto before =
      provenance_refs(std::vector<std::string>(lines.begin(), lines.begin() + 150), 0);
  const auto after = provenance_refs(std::vector<std::string>(lines.begin() + 150, lines.end()), 0);
  ASSERT_EQ(before.size(), 600u);
  ASSERT_EQ(after.size(), 1000u);  // the other files' 1000, none of part-00001's 400 unread
  for (std::uint64_t i = 0; i < 600; ++i) EXPECT_EQ(before[i], i);
  // Now numbered: part-00002.bin from 500, part-00003.bin from 1000 — records 1000..1999 then.
  for (std::uint64_t i = 0; i < 1000; ++i) EXPECT_EQ(after[i], 500 + i);
  r = run({"run", "seq.yaml", "--provenance", "fresh.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(without_steps(lines, 1), without_steps(read_lines(path("fresh.txt")), 1));
  EXPECT_EQ(without_steps(lines, 1).size(), 375u);
}

/// Kills `flowstate run <args>` with SIGKILL once it has written the checkpoint of step `at`
/// and before its next one: its digests go through a FIFO of one page, read up to step
/// `at` - 1, on which the run blocks some 150 steps later.
void run_and_kill_after(const std::vector<std::string>& args, const fs::path& dir, std::size_t at) {
  const std::string fifo = dir / "kill.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  ASSERT_GE(::fcntl(fd, F_SETPIPE_SZ, 4096), 0);
  std::vector<std::string> all = args;
  all.insert(all.end(), {"--digests", "kill.fifo"});
  {
    CliProcess killed(all, dir.string());
    std::size_t lines = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (lines < at && std::chrono::steady_clock::now() < deadline) {
      char buf[256];
      const ssize_t n = ::read(fd, buf, std::min<std::size_t>(sizeof buf, 4096));
      if (n <= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      lines += static_cast<std::size_t>(std::count(buf, buf + n, '\n'));
    }
    char name[32];
    std::snprintf(name, sizeof name, "ck/step-%012zu", at);
    while (!fs::exists(dir / name) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_FALSE(killed.exited());
    killed.signal(SIGKILL);
    EXPECT_EQ(killed.wait().status, 128 + SIGKILL);
  }
  ::close(fd);
  fs::remove(fifo);
}

/// The same glob under a global shuffle (or a shard of rank 1 of 2 and a shuffle): a file
/// removed while a run killed with SIGKILL mid-epoch was down. The resumed epoch is the
/// uninterrupted run's less the removed file's records (numbered as the files now number
/// them), the next a fresh run's over the kept files.
class CliFileRemoved : public CliDataChange, public ::testing::WithParamInterface<bool> {};

TEST_P(CliFileRemoved, AfterASigkillMidEpochUnderAShuffleTheRestSkipsTheRemovedFile) {
  const bool sharded = GetParam();
  write_file(path("shuf.yaml"),
             std::string("seed: 4\nsource: {type: records, paths: 'data/part-*.bin', "
                         "record_bytes: 16}\nnodes:\n") +
                 (sharded ? "  - shard: {rank: 1, world: 2}\n" : "") +
                 "  - shuffle: {mode: global}\n  - batch: {size: 4}\nepochs: 2\n");
  CliResult r = run({"run", "shuf.yaml", "--provenance", "full.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto full = read_lines(path("full.txt"));
  const std::size_t per_epoch = sharded ? 250 : 500;
  ASSERT_EQ(full.size(), 2 * per_epoch);
  const std::size_t at = 200;  // mid epoch 0 (of 250 or 500 steps)
  run_and_kill_after(
      {"run", "shuf.yaml", "--checkpoint-dir", "ck", "--checkpoint-every", std::to_string(at)},
      dir_.path(), at);
  ASSERT_TRUE(fs::exists(
      path("ck/step-" + std::string(12 - std::to_string(at).size(), '0') + std::to_string(at))));
  fs::remove(path("data/part-00002.bin"));  // records 1000..1499
  r = run({"run", "shuf.yaml", "--checkpoint-dir", "ck", "--resume", "--data-changed", "continue",
           "--provenance", "p.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string note = "data change at step " + std::to_string(at) +
                           ": records: data/part-00002.bin removed: its 500 records are skipped "
                           "where '" +
                           (sharded ? "shard" : "shuffle") + "' has not yet delivered them";
  EXPECT_NE(r.err.find(note), std::string::npos) << r.err;
  const auto lines = read_lines(path("p.txt"));
  // The rest of epoch 0: the uninterrupted run's records from step `at` on, less the removed
  // file's, in order; part-00003.bin is numbered from 1000 now.
  std::vector<std::uint64_t> expected;
  for (auto id : provenance_refs(std::vector<std::string>(full.begin() + at, full.end()), 0))
    if (id < 1000 || id >= 1500) expected.push_back(id < 1000 ? id : id - 500);
  const auto rest = provenance_refs(lines, 0);
  EXPECT_EQ(rest, expected);
  // With the records before the kill (the uninterrupted run's), every kept record once.
  std::vector<std::uint64_t> epoch0;
  for (auto id : provenance_refs(std::vector<std::string>(full.begin(), full.begin() + at), 0))
    epoch0.push_back(id >= 1500 ? id - 500 : id >= 1000 ? ~std::uint64_t{0} : id);
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  std::sort(epoch0.begin(), epoch0.end());
  EXPECT_EQ(std::adjacent_find(epoch0.begin(), epoch0.end(),
                               [](auto a, auto b) { return a == b && a != ~std::uint64_t{0}; }),
            epoch0.end());
  if (!sharded) {
    epoch0.erase(std::remove(epoch0.begin(), epoch0.end(), ~std::uint64_t{0}), epoch0.end());
    ASSERT_EQ(epoch0.size(), 1500u);
    for (std::uint64_t i = 0; i < 1500; ++i) ASSERT_EQ(epoch0[i], i);
  }
  // Epoch 1: a fresh run's over the three files.
  r = run({"run", "shuf.yaml", "--provenance", "fresh.txt"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(without_steps(lines, 1), without_steps(read_lines(path("fresh.txt")), 1));
  EXPECT_EQ(without_steps(lines, 1).size(), sharded ? 188u : 375u);
  r = run({"inspect", "ck"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data changes:\n  step " + std::to_string(at) +
                       ": records: data/part-00002.bin removed: its 500 records are skipped"),
            std::string::npos)
      << r.out;
}

// (The shard case is the C++ test's: the command refuses a shard whose rank is not the
// launcher's, so a rank-1 run needs a launcher's environment.)
INSTANTIATE_TEST_SUITE_P(Layouts, CliFileRemoved, ::testing::Values(false),
                         [](const auto& info) { return info.param ? "Shard" : "Shuffle"; });

}  // namespace
}  // namespace flowstate
