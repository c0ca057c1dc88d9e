// Loader::save_checkpoint / save_checkpoint_async / restore: resuming from disk is exact, the
// fingerprint refuses pipelines whose output differs and accepts free parameters, and skip
// ranges travel with checkpoints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::BatchTrace;
using testing::checkpoint_error;
using testing::drain;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::list_dir;
using testing::read_file;
using testing::step_dir;
using testing::TempDir;

using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

struct Variant {
  std::uint64_t batch = 64;
  std::uint64_t seed = 1234;
  std::size_t record_bytes = 64;
};

/// 1000 records of 64 bytes in 3 files, buffer shuffle, batches of 64: 16 batches per epoch,
/// the last one short.
Pipeline small_pipeline(const std::string& glob, Variant v = {}) {
  return Pipeline::Builder()
      .seed(v.seed)
      .workers(2)
      .records({.paths = {glob}, .record_bytes = v.record_bytes})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
      .batch({.size = v.batch})
      .prefetch({.depth = 3})
      .build();
}

std::vector<BatchTrace> tail(const std::vector<BatchTrace>& v, std::size_t from) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from), v.end()};
}

std::vector<std::uint64_t> steps_of(const std::vector<BatchTrace>& v) {
  std::vector<std::uint64_t> out;
  for (const auto& t : v) out.push_back(t.step);
  return out;
}

class LoaderCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    glob_ = testing::write_records(dir_ / "data", 1000, 64, 3);
    Loader l(make(), options_);
    full_ = drain(l);
    ASSERT_EQ(full_.size(), 32u);
  }
  Pipeline make(Variant v = {}) const { return small_pipeline(glob_, v); }
  /// The uninterrupted run with `ranges` skipped from the start.
  std::vector<BatchTrace> full_with_skips(const Ranges& ranges) const {
    Loader l(make(), options_);
    for (auto [a, b] : ranges) l.skip(a, b);
    return drain(l);
  }
  std::string ckpt(const std::string& name = "ckpt") const { return dir_ / name; }

  TempDir dir_;
  std::string glob_;
  LoaderOptions options_{.epochs = 2};
  std::vector<BatchTrace> full_;
};

TEST_F(LoaderCheckpoints, ResumesFromDiskExactlyAtEveryOracleBreakpoint) {
  // The breakpoints of the save/restore oracle: 0, 1, mid first epoch, before and at the end
  // of the first epoch, mid second epoch, the end.
  std::set<std::size_t> breaks{0, 1, full_.size() / 5, 15, 16, 24, full_.size()};
  ASSERT_TRUE(full_[15].last && full_[15].epoch == 0);
  for (std::size_t k : breaks) {
    SCOPED_TRACE("breakpoint after " + std::to_string(k) + " batches");
    const std::string dir = ckpt("at-" + std::to_string(k));
    std::vector<BatchTrace> got;
    {
      Loader l(make(), options_);
      got = drain(l, k);
      ASSERT_EQ(got.size(), k);
      // Both ways of saving write the same thing.
      std::string path = k % 2 == 0 ? l.save_checkpoint(dir) : l.save_checkpoint_async(dir).get();
      EXPECT_EQ(path, dir + "/" + step_dir(k));
    }
    Loader resumed(make(), options_);
    auto found = resumed.restore(dir);
    ASSERT_TRUE(found);
    EXPECT_EQ(found->step, k);
    EXPECT_EQ(found->path, dir + "/" + step_dir(k));
    EXPECT_TRUE(found->skipped.empty());
    EXPECT_EQ(resumed.last_step(), k == 0 ? std::nullopt : std::optional<std::uint64_t>(k - 1));
    auto rest = drain(resumed);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got.size(), full_.size());
    for (std::size_t i = 0; i < full_.size(); ++i) ASSERT_EQ(got[i], full_[i]) << "batch " << i;
  }
}

TEST_F(LoaderCheckpoints, WorkersAndPrefetchDepthMayChangeAcrossARestore) {
  const LoaderOptions narrow{.epochs = 2, .workers = 1, .prefetch = 1};
  const LoaderOptions wide{.epochs = 2, .workers = 4, .prefetch = 8};
  for (auto [save, load] : {std::pair{narrow, wide}, std::pair{wide, narrow}}) {
    SCOPED_TRACE("saved with " + std::to_string(*save.workers) + " workers");
    TempDir d;
    std::vector<BatchTrace> got;
    {
      Loader l(make(), save);
      got = drain(l, 9);
      l.save_checkpoint(d.str());
    }
    Loader resumed(make(), load);
    ASSERT_TRUE(resumed.restore(d.str()));
    auto rest = drain(resumed);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, full_);
  }
}

TEST_F(LoaderCheckpoints, RefusesAPipelineWhoseOutputDiffersAndNamesTheField) {
  {
    Loader l(make(), options_);
    drain(l, 4);
    l.save_checkpoint(ckpt());
  }
  const std::string path = ckpt() + "/" + step_dir(4);
  const std::string prefix =
      "cannot restore " + path + ": the state was saved by a pipeline whose output differs:\n";
  const std::string other_glob = testing::write_records(dir_ / "other", 1000, 64, 3);
  struct Case {
    std::string name;
    Pipeline pipeline;
    std::string difference;
  };
  std::vector<Case> cases;
  cases.push_back({"batch size", make({.batch = 32}), "batch.size: 64 in checkpoint, 32 now"});
  cases.push_back({"seed", make({.seed = 99}), "seed: 1234 in checkpoint, 99 now"});
  cases.push_back({"record size", make({.record_bytes = 32}),
                   "records.record_bytes: 64 in checkpoint, 32 now"});
  cases.push_back({"source files", small_pipeline(other_glob),
                   "records.paths: " + glob_ + " in checkpoint, " + other_glob + " now"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<BatchTrace> own;
    {
      Loader l(c.pipeline, options_);
      own = drain(l);
    }
    Loader l(c.pipeline, options_);
    auto before = drain(l, 2);
    try {
      l.restore(ckpt());
      ADD_FAILURE() << "restore accepted a different pipeline";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(std::string(e.what()), prefix + c.difference);
      EXPECT_EQ(e.file(), path + "/state.bin");
    }
    // Refused means unchanged: the loader goes on where it was.
    auto rest = drain(l);
    before.insert(before.end(), rest.begin(), rest.end());
    EXPECT_EQ(before, own);
  }
}

TEST_F(LoaderCheckpoints, ARefusedRestoreLeavesTheLoaderRunning) {
  // The fingerprint matches but the data changed (the files shrank): the data identity
  // refuses it, naming each file, and the loader must continue as if restore had not been
  // called.
  {
    Loader l(make(), options_);
    drain(l, 12);  // 768 samples drawn in epoch 0
    l.save_checkpoint(ckpt());
  }
  std::filesystem::remove_all(dir_ / "data");
  testing::write_records(dir_ / "data", 500, 64, 3);
  std::vector<BatchTrace> own;
  {
    Loader l(make(), options_);
    own = drain(l);
  }
  Loader l(make(), options_);
  auto got = drain(l, 2);
  const std::string data = dir_ / "data/";
  EXPECT_EQ(checkpoint_error([&] { l.restore(ckpt()); }),
            "cannot restore " + ckpt() + "/" + step_dir(12) + ": records: " + data +
                "part-00000.bin: 21312 bytes in checkpoint, 10624 now\nrecords: " + data +
                "part-00001.bin: 21312 bytes in checkpoint, 10688 now\nrecords: " + data +
                "part-00002.bin: 21376 bytes in checkpoint, 10688 now");
  auto rest = drain(l);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, own);
}

TEST_F(LoaderCheckpoints, RestoringFromNothingChangesNothing) {
  Loader l(make(), options_);
  auto got = drain(l, 3);
  EXPECT_FALSE(l.restore(ckpt("missing")));
  std::filesystem::create_directories(ckpt("empty"));
  EXPECT_FALSE(l.restore(ckpt("empty")));
  auto rest = drain(l);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full_);
}

TEST_F(LoaderCheckpoints, AsyncSaveCapturesTheStateWhenCalled) {
  std::future<std::string> saved;
  {
    Loader l(make(), options_);
    drain(l, 5);
    saved = l.save_checkpoint_async(ckpt());
    drain(l, 7);  // the consumer moves on while the files are written
  }
  EXPECT_EQ(saved.get(), ckpt() + "/" + step_dir(5));
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 5u);
  EXPECT_EQ(drain(resumed), tail(full_, 5));
}

TEST_F(LoaderCheckpoints, AsyncSavesCommitInTheOrderTheyWereAsked) {
  // The first write is slowed down; later ones must still commit after it, so LATEST ends on
  // the newest state.
  std::mutex mu;
  std::vector<std::string> committed;
  std::vector<std::future<std::string>> futures;
  Loader l(make(), options_);
  for (int i = 0; i < 5; ++i) {
    drain(l, 2);
    CheckpointWriteOptions o;
    o.hook = [&, first = i == 0](std::string_view phase) {
      if (first && phase == "tmp-created")
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
      if (phase == "latest-written") {
        std::lock_guard lock(mu);
        committed.push_back(read_file(ckpt() + "/LATEST"));
      }
    };
    futures.push_back(l.save_checkpoint_async(ckpt(), o));
  }
  // A synchronous save waits for the ones before it, too.
  drain(l, 1);
  EXPECT_EQ(l.save_checkpoint(ckpt()), ckpt() + "/" + step_dir(11));
  for (auto& f : futures) f.get();
  EXPECT_THAT(committed, ElementsAre(step_dir(2) + "\n", step_dir(4) + "\n", step_dir(6) + "\n",
                                     step_dir(8) + "\n", step_dir(10) + "\n"));
  EXPECT_EQ(read_file(ckpt() + "/LATEST"), step_dir(11) + "\n");
}

TEST_F(LoaderCheckpoints, ACheckpointBeforeTheFirstBatchIsStepZero) {
  {
    Loader l(make(), options_);
    EXPECT_EQ(l.save_checkpoint(ckpt()), ckpt() + "/" + step_dir(0));
  }
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 0u);
  EXPECT_EQ(drain(resumed), full_);
}

TEST_F(LoaderCheckpoints, ReCheckpointingAfterAResumeReplacesTheStep) {
  {
    Loader l(make(), options_);
    drain(l, 5);
    l.save_checkpoint(ckpt());
  }
  std::vector<std::string> phases;
  {
    Loader l(make(), options_);
    ASSERT_TRUE(l.restore(ckpt()));
    CheckpointWriteOptions o;
    o.hook = [&](std::string_view p) { phases.emplace_back(p); };
    EXPECT_EQ(l.save_checkpoint(ckpt(), o), ckpt() + "/" + step_dir(5));
  }
  EXPECT_THAT(phases, ::testing::Contains("moved-aside"));
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "LATEST", step_dir(5)}));
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 5u);
  EXPECT_EQ(drain(resumed), tail(full_, 5));
}

TEST_F(LoaderCheckpoints, FallsBackToAnOlderCheckpointWhenTheNewestIsDamaged) {
  {
    Loader l(make(), options_);
    drain(l, 4);
    l.save_checkpoint(ckpt());
    drain(l, 6);
    l.save_checkpoint(ckpt());
  }
  testing::truncate_file(ckpt() + "/" + step_dir(10) + "/state.bin", 10);
  Loader resumed(make(), options_);
  auto found = resumed.restore(ckpt());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 4u);
  ASSERT_EQ(found->skipped.size(), 1u);
  EXPECT_THAT(found->skipped[0], HasSubstr("state.bin' is truncated: it has 10 bytes"));
  EXPECT_EQ(drain(resumed), tail(full_, 4));
}

TEST_F(LoaderCheckpoints, RestoreRefusesEvidenceOfCheckpointsWhenNoneVerifies) {
  // A LATEST without its step directory: never a fresh start.
  std::filesystem::create_directories(ckpt());
  testing::write_file(ckpt() + "/LATEST", step_dir(7700) + "\n");
  Loader l(make(), options_);
  EXPECT_EQ(checkpoint_error([&] { l.restore(ckpt()); }),
            "no checkpoint under '" + ckpt() + "' verifies:\n  " + ckpt() + "/LATEST: '" + ckpt() +
                "/LATEST' names '" + ckpt() + "/" + step_dir(7700) + "', which does not exist");
  // An unfinished write of the first checkpoint (the run got that far) is evidence too.
  std::filesystem::remove(ckpt() + "/LATEST");
  std::filesystem::create_directories(ckpt() + "/" + step_dir(40) + ".tmp");
  EXPECT_EQ(checkpoint_error([&] { l.restore(ckpt()); }),
            "no checkpoint under '" + ckpt() + "' verifies:\n  " + ckpt() + "/" + step_dir(40) +
                ".tmp: '" + ckpt() + "/" + step_dir(40) +
                ".tmp' is an unfinished checkpoint write or removal");
  EXPECT_EQ(drain(l), full_);  // refused: the loader is unchanged
}

TEST_F(LoaderCheckpoints, ANewerValidStepWinsOverAnOlderLatest) {
  {
    Loader l(make(), options_);
    drain(l, 4);
    l.save_checkpoint(ckpt());
    drain(l, 6);
    l.save_checkpoint(ckpt());
  }
  testing::write_file(ckpt() + "/LATEST", step_dir(4) + "\n");
  Loader resumed(make(), options_);
  auto found = resumed.restore(ckpt());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 10u);
  EXPECT_TRUE(found->skipped.empty());
  EXPECT_EQ(drain(resumed), tail(full_, 10));
}

TEST_F(LoaderCheckpoints, AFreshRunMayNotSaveBelowAnotherRunsCheckpoints) {
  {
    Loader l(make(), options_);
    drain(l, 12);
    l.save_checkpoint(ckpt());
  }
  Loader fresh(make(), options_);
  drain(fresh, 3);
  const std::string refused = "'" + ckpt() +
                              "' holds checkpoints up to step 12, newer than this one (step "
                              "3); restore from it to continue that run, or write with "
                              "overwrite to put an older step under it";
  EXPECT_EQ(checkpoint_error([&] { fresh.save_checkpoint(ckpt()); }), refused);
  EXPECT_EQ(checkpoint_error([&] { fresh.save_checkpoint_async(ckpt()).get(); }),
            "checkpoint '" + ckpt() + "/" + step_dir(3) + "' failed: " + refused);
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "LATEST", step_dir(12)}));
  // The failure was also the next batch's news; then the loader goes on.
  EXPECT_THROW(fresh.next(), CheckpointError);
  // Asked for: written under the newer one (which a resume still prefers).
  EXPECT_EQ(fresh.save_checkpoint(ckpt(), {.overwrite = true}), ckpt() + "/" + step_dir(3));
  // Or the directory emptied first, as `flowstate run --overwrite` does.
  remove_checkpoints(ckpt());
  EXPECT_EQ(fresh.save_checkpoint(ckpt()), ckpt() + "/" + step_dir(3));
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 3u);
  EXPECT_EQ(drain(resumed), tail(full_, 3));
}

TEST_F(LoaderCheckpoints, AFailedAsyncSaveSurfacesAtTheNextBatch) {
  // The directory's parent is a file: the write fails with ENOTDIR (also as root, where a
  // read-only directory would not fail).
  testing::write_file(dir_ / "file", "not a directory");
  const std::string bad = dir_ / "file/ckpt";
  Loader l(make(), options_);
  auto got = drain(l, 3);
  std::future<std::string> saved = l.save_checkpoint_async(bad);
  saved.wait();
  const std::string expected = "checkpoint '" + bad + "/" + step_dir(3) +
                               "' failed: cannot create directory '" + bad +
                               "': " + std::strerror(ENOTDIR);
  try {
    l.next();
    ADD_FAILURE() << "the failed save went unnoticed";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
    EXPECT_EQ(e.file(), bad + "/" + step_dir(3));
  }
  EXPECT_EQ(checkpoint_error([&] { saved.get(); }), expected);
  // Reported once; no batch was lost.
  auto rest = drain(l);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full_);
}

TEST_F(LoaderCheckpoints, AnAsyncSaveWaitsForThePreviousOneToCommit) {
  // Saves asked for faster than the disk commits them block the caller: every one is
  // written, in order, and at most one is in flight.
  std::atomic<int> in_flight{0}, most{0}, committed{0};
  CheckpointWriteOptions o;
  o.hook = [&](std::string_view phase) {
    if (phase == "tmp-created") {
      most = std::max(most.load(), ++in_flight);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    if (phase == "latest-written") {
      --in_flight;
      ++committed;
    }
  };
  Loader l(make(), options_);
  std::vector<std::future<std::string>> futures;
  for (int i = 1; i <= 4; ++i) {
    drain(l, 1);
    futures.push_back(l.save_checkpoint_async(ckpt(), o));
    EXPECT_GE(committed.load(), i - 1) << "save " << i << " did not wait for the one before";
  }
  for (std::size_t i = 0; i < futures.size(); ++i)
    EXPECT_EQ(futures[i].get(), ckpt() + "/" + step_dir(i + 1));
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(list_dir(ckpt()).size(), 2u + 4u);
}

// ---- skip ranges through checkpoints ----

TEST_F(LoaderCheckpoints, ASkipRegisteredBeforeACheckpointTravelsWithIt) {
  // 14..17 spans the end of epoch 0 (indices 14, 15) and the start of epoch 1: step 13
  // becomes the epoch's last batch.
  const auto expect = full_with_skips({{14, 17}});
  ASSERT_TRUE(expect[13].last);
  {
    Loader l(make(), options_);
    drain(l, 3);
    l.skip(14, 17);
    l.save_checkpoint(ckpt());
  }
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 3u);
  EXPECT_EQ(resumed.state_struct().skips, (Ranges{{14, 17}}));
  EXPECT_EQ(drain(resumed), tail(expect, 3));
}

TEST_F(LoaderCheckpoints, ACheckpointTakenBeforeASkipDoesNotKnowIt) {
  const auto expect = full_with_skips({{5, 8}});
  {
    Loader l(make(), options_);
    auto got = drain(l, 3);
    l.save_checkpoint(ckpt());  // no skips yet
    l.skip(5, 8);
    auto rest = drain(l);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, expect);
  }
  {
    // Resuming from it replays steps 5..8: the range was added after the checkpoint.
    Loader resumed(make(), options_);
    ASSERT_TRUE(resumed.restore(ckpt()));
    EXPECT_TRUE(resumed.state_struct().skips.empty());
    EXPECT_EQ(drain(resumed), tail(full_, 3));
  }
  // Skipping it again after the restore gives the run that skipped.
  Loader resumed(make(), options_);
  ASSERT_TRUE(resumed.restore(ckpt()));
  resumed.skip(5, 8);
  EXPECT_EQ(drain(resumed), tail(expect, 3));
}

TEST_F(LoaderCheckpoints, ACheckpointAfterASkippedRangeContinuesPastIt) {
  const auto expect = full_with_skips({{5, 8}});
  {
    Loader l(make(), options_);
    l.skip(5, 8);
    auto got = drain(l, 7);  // steps 0..4, 9, 10
    EXPECT_THAT(steps_of(got), ElementsAre(0, 1, 2, 3, 4, 9, 10));
    EXPECT_EQ(l.save_checkpoint(ckpt()), ckpt() + "/" + step_dir(11));
  }
  Loader resumed(make(), options_);
  ASSERT_EQ(resumed.restore(ckpt())->step, 11u);
  EXPECT_EQ(resumed.state_struct().skips, (Ranges{{5, 8}}));
  EXPECT_EQ(drain(resumed), tail(expect, 7));
}

TEST_F(LoaderCheckpoints, OverlappingAndAdjacentRangesMergeAndSurviveACheckpoint) {
  const auto expect = full_with_skips({{10, 16}, {20, 21}});
  {
    Loader l(make(), options_);
    l.skip(10, 12);
    l.skip(11, 14);  // overlaps
    l.skip(15, 16);  // adjacent
    l.skip(20, 21);
    EXPECT_EQ(l.state_struct().skips, (Ranges{{10, 16}, {20, 21}}));
    l.save_checkpoint(ckpt());
  }
  Loader resumed(make(), options_);
  ASSERT_TRUE(resumed.restore(ckpt()));
  EXPECT_EQ(resumed.state_struct().skips, (Ranges{{10, 16}, {20, 21}}));
  auto got = drain(resumed);
  EXPECT_EQ(got, expect);
  for (const auto& t : got) EXPECT_FALSE((t.step >= 10 && t.step <= 16) || t.step == 20);
}

TEST_F(LoaderCheckpoints, SkipRejectsReversedAndPassedRangesAfterARestore) {
  {
    Loader l(make(), options_);
    drain(l, 8);
    l.save_checkpoint(ckpt());
  }
  Loader resumed(make(), options_);
  ASSERT_TRUE(resumed.restore(ckpt()));  // last delivered step: 7
  auto config_error = [&](std::uint64_t a, std::uint64_t b) -> std::string {
    try {
      resumed.skip(a, b);
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "skip");
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(config_error(9, 8), "skip range 9:8 is reversed (first > last)");
  EXPECT_EQ(config_error(7, 9),
            "skip range 7:9 starts at or before step 7, which was already "
            "delivered");
  EXPECT_EQ(config_error(2, 3),
            "skip range 2:3 starts at or before step 7, which was already "
            "delivered");
  EXPECT_TRUE(resumed.state_struct().skips.empty());  // failed calls added nothing
  resumed.skip(8, 8);
  EXPECT_EQ(drain(resumed), tail(full_with_skips({{8, 8}}), 8));
}

}  // namespace
}  // namespace flowstate
