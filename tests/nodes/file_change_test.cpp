// Files added to or removed from a source's glob between a checkpoint and its resume (issue
// 25): refused without the opt-in, as data identity always did; with it (LoaderOptions::
// on_data_change), files added wait for the next epoch and files removed have their unread
// records of this epoch skipped. Each rule is checked against oracles built here: the rest of
// the epoch is the uninterrupted run's (less the removed files' records), counted so that no
// record comes twice and none of a kept file is lost, and the next epoch is a fresh pipeline's
// over the new files.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;
using testing::checkpoint_error;
using testing::record_index;
using testing::TempDir;

/// Record ids, in delivery order, with the epoch each came in.
struct Delivered {
  std::vector<std::uint64_t> ids;
  std::vector<std::uint64_t> epochs;
};

/// Five files of 50 records each (ids 50k..50k+49 in part-0000k.bin) made once in `pool/`;
/// each test copies some into `data/`, whose glob its pipelines read.
class FileChangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_records(dir_ / "pool", 250, 16, 5);
    fs::create_directories(dir_ / "data");  // names in messages: <dir>/data/part-0000k.bin
  }
  void add(int k) {
    const std::string name = "part-0000" + std::to_string(k) + ".bin";
    fs::copy_file(dir_ / ("pool/" + name), dir_ / ("data/" + name));
  }
  void remove(int k) { fs::remove(dir_ / ("data/part-0000" + std::to_string(k) + ".bin")); }
  /// Whether record `id` lies in file k.
  static int file_of(std::uint64_t id) { return static_cast<int>(id / 50); }

  Pipeline make(bool shuffle, std::size_t batch = 4) const {
    Pipeline::Builder b;
    b.seed(5).records({.paths = {dir_ / "data/part-*.bin"}, .record_bytes = 16});
    if (shuffle) b.shuffle({.mode = ShuffleMode::kGlobal});
    return b.batch({.size = batch}).build();
  }
  static void append(Delivered& d, const Batch& b) {
    const Tensor& t = b["data"];
    for (std::int64_t i = 0; i < t.shape()[0]; ++i) {
      d.ids.push_back(record_index(static_cast<const std::byte*>(t.data()) + i * 16));
      d.epochs.push_back(b.info.epoch);
    }
  }
  static Delivered take(Loader& l, std::size_t batches) {
    Delivered d;
    for (std::size_t k = 0; k < batches; ++k) {
      auto b = l.next();
      EXPECT_TRUE(b);
      if (!b) break;
      append(d, *b);
    }
    return d;
  }
  /// Every record delivered from now on in `epoch`, and nothing of later epochs.
  static std::vector<std::uint64_t> epoch_rest(Loader& l, std::uint64_t epoch) {
    std::vector<std::uint64_t> out;
    while (auto b = l.next()) {
      Delivered d;
      append(d, *b);
      EXPECT_EQ(b->info.epoch, epoch);
      out.insert(out.end(), d.ids.begin(), d.ids.end());
      if (b->info.is_last_in_epoch) break;
    }
    return out;
  }
  /// Epoch `epoch` of a fresh pipeline over the files in data/ now.
  std::vector<std::uint64_t> fresh_epoch(bool shuffle, std::uint64_t epoch) const {
    Loader l(make(shuffle), {.epochs = epoch + 1});
    std::vector<std::uint64_t> out;
    while (auto b = l.next()) {
      if (b->info.epoch != epoch) continue;
      Delivered d;
      append(d, *b);
      out.insert(out.end(), d.ids.begin(), d.ids.end());
    }
    return out;
  }
  /// Within an epoch no record twice, and every record of `files` there.
  static void expect_exactly_once(const std::vector<std::uint64_t>& epoch,
                                  const std::set<int>& files) {
    std::set<std::uint64_t> seen;
    for (auto id : epoch) EXPECT_TRUE(seen.insert(id).second) << "record " << id << " twice";
    for (int k : files)
      for (std::uint64_t id = 50u * k; id < 50u * (k + 1u); ++id)
        EXPECT_TRUE(seen.contains(id)) << "record " << id << " of file " << k << " lost";
  }

  TempDir dir_;
};

TEST_F(FileChangeTest, FilesAddedAreRefusedWithoutTheOptInNamingThem) {
  for (int k : {0, 1, 3}) add(k);
  Loader a(make(true));
  take(a, 5);
  add(2);
  Loader b(make(true));
  const std::string what = checkpoint_error([&] { b.load_state(a.state()); });
  EXPECT_NE(what.find("/data/part-00002.bin is new (not in the checkpoint)"), std::string::npos)
      << what;
  EXPECT_NE(what.find("--data-changed continue"), std::string::npos) << what;
}

TEST_F(FileChangeTest, FilesAddedWaitForTheNextEpochThroughAGlobalShuffle) {
  for (int k : {0, 1, 3}) add(k);
  Loader a(make(true), {.epochs = 2});
  const Delivered before = take(a, 10);
  const std::string state = a.state();
  // `a` goes on uninterrupted over the files it started with: the epoch's oracle.
  const std::vector<std::uint64_t> old_rest = epoch_rest(a, 0);

  add(2);  // between kept files in sorted order: every later file is numbered otherwise
  add(4);
  Loader b(make(true), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
  b.load_state(state);
  const std::vector<std::uint64_t> rest = epoch_rest(b, 0);
  EXPECT_EQ(rest, old_rest);
  std::vector<std::uint64_t> epoch0 = before.ids;
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  EXPECT_EQ(epoch0.size(), 150u);
  expect_exactly_once(epoch0, {0, 1, 3});

  // The next epoch: a fresh pipeline's epoch 1 over the five files.
  const std::vector<std::uint64_t> epoch1 = epoch_rest(b, 1);
  EXPECT_EQ(epoch1, fresh_epoch(true, 1));
  expect_exactly_once(epoch1, {0, 1, 2, 3, 4});

  // Recorded: at the resume step, what was added.
  const PipelineState s = b.state_struct();
  ASSERT_EQ(s.data_changes.size(), 1u);
  EXPECT_EQ(s.data_changes[0].step, 10u);
  EXPECT_NE(s.data_changes[0].what.find("/data/part-00002.bin added (50 records): epoch "
                                        "0 finishes over the 3 files it started with, epoch 1 "
                                        "reads 5"),
            std::string::npos)
      << s.data_changes[0].what;
  EXPECT_NE(s.data_changes[0].what.find("/data/part-00004.bin added"), std::string::npos);
}

TEST_F(FileChangeTest, ALaterResumeOfTheChangedRunReplaysItAndRecordsNothing) {
  for (int k : {0, 1, 3}) add(k);
  Loader a(make(true), {.epochs = 2});
  take(a, 10);
  const std::string state = a.state();
  add(2);
  const LoaderOptions opt_in{.epochs = 2, .on_data_change = OnDataChange::kContinue};
  Loader b(make(true), opt_in);
  b.load_state(state);
  take(b, 6);
  const std::string mid = b.state();  // within epoch 0, after the change
  const Delivered tail = take(b, 60);
  // Resumed from `mid` (the same files, no opt-in needed): the same records, the epoch still
  // over the three files, the same history.
  Loader c(make(true), {.epochs = 2});
  c.load_state(mid);
  const Delivered again = take(c, 60);
  EXPECT_EQ(again.ids, tail.ids);
  EXPECT_EQ(again.epochs, tail.epochs);
  EXPECT_EQ(c.state_struct().data_changes.size(), 1u);
  // And from a state of epoch 1 the same.
  Loader d(make(true), {.epochs = 2});
  d.load_state(b.state());
  Loader e(make(true), opt_in);
  e.load_state(b.state());
  EXPECT_EQ(take(d, 5).ids, take(e, 5).ids);
}

TEST_F(FileChangeTest, FilesRemovedHaveTheirUnreadRecordsOfTheEpochSkipped) {
  for (int k : {0, 1, 2, 3}) add(k);
  Loader a(make(false), {.epochs = 2});
  const Delivered before = take(a, 15);  // 60 records: file 1 is read up to its 10th
  const std::string state = a.state();
  const std::vector<std::uint64_t> old_rest = epoch_rest(a, 0);

  remove(1);
  Loader refused(make(false), {.epochs = 2});
  const std::string what = checkpoint_error([&] { refused.load_state(state); });
  EXPECT_NE(what.find("/data/part-00001.bin was in the checkpoint and is gone"), std::string::npos)
      << what;

  Loader b(make(false), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
  b.load_state(state);
  const std::vector<std::uint64_t> rest = epoch_rest(b, 0);
  // The uninterrupted epoch less the removed file's records.
  std::vector<std::uint64_t> expected;
  for (auto id : old_rest)
    if (file_of(id) != 1) expected.push_back(id);
  EXPECT_EQ(rest, expected);
  std::vector<std::uint64_t> epoch0 = before.ids;
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  expect_exactly_once(epoch0, {0, 2, 3});
  EXPECT_EQ(epoch0.size(), 60u + 100u);  // file 1's 40 unread records skipped

  const std::vector<std::uint64_t> epoch1 = epoch_rest(b, 1);
  EXPECT_EQ(epoch1, fresh_epoch(false, 1));
  expect_exactly_once(epoch1, {0, 2, 3});
  EXPECT_EQ(epoch1.size(), 150u);

  const PipelineState s = b.state_struct();
  ASSERT_EQ(s.data_changes.size(), 1u);
  EXPECT_EQ(s.data_changes[0].step, 15u);
  EXPECT_NE(s.data_changes[0].what.find("/data/part-00001.bin removed: 40 records of "
                                        "its 50 not yet read in epoch 0 are skipped"),
            std::string::npos)
      << s.data_changes[0].what;
}

TEST_F(FileChangeTest, ARemovalMidEpochIsRefusedThroughAShuffleNamingIt) {
  for (int k : {0, 1, 2}) add(k);
  Loader a(make(true));
  take(a, 5);
  remove(2);
  Loader b(make(true), {.on_data_change = OnDataChange::kContinue});
  const std::string what = checkpoint_error([&] { b.load_state(a.state()); });
  EXPECT_NE(what.find("'shuffle' after it replays or permutes its upstream's positions from its "
                      "state: files removed mid-epoch cannot continue exactly through it "
                      "(" +
                      (dir_ / "data/part-00002.bin") + " removed)"),
            std::string::npos)
      << what;
}

TEST_F(FileChangeTest, AFileWhoseContentsChangedIsRefusedEvenWithTheOptIn) {
  for (int k : {0, 1}) add(k);
  Loader a(make(false));
  take(a, 5);
  // part-00001.bin now holds part-00002's records (same size, other bytes).
  fs::copy_file(dir_ / "pool/part-00002.bin", dir_ / "data/part-00001.bin",
                fs::copy_options::overwrite_existing);
  add(3);
  Loader b(make(false), {.on_data_change = OnDataChange::kContinue});
  const std::string what = checkpoint_error([&] { b.load_state(a.state()); });
  EXPECT_NE(what.find("/data/part-00001.bin: content differs"), std::string::npos) << what;
  EXPECT_NE(what.find("a file whose contents changed cannot"), std::string::npos) << what;
}

TEST_F(FileChangeTest, TheSameFilesWithTheOptInRecordNothing) {
  for (int k : {0, 1}) add(k);
  Loader a(make(true));
  take(a, 5);
  Loader b(make(true), {.on_data_change = OnDataChange::kContinue});
  b.load_state(a.state());
  EXPECT_TRUE(b.state_struct().data_changes.empty());
  EXPECT_EQ(take(b, 5).ids, take(a, 5).ids);
}

}  // namespace
}  // namespace flowstate
