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
#include "flowstate/tools/testing.h"
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
 public:
  /// The source, then the nodes that address it by position or hold its Refs.
  enum class Layout { kGlobal, kBuffer, kShard0, kShard1, kPack };

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
  Pipeline make(Layout layout) const {
    Pipeline::Builder b;
    b.seed(5).records({.paths = {dir_ / "data/part-*.bin"}, .record_bytes = 16});
    switch (layout) {
      case Layout::kGlobal:
        b.shuffle({.mode = ShuffleMode::kGlobal});
        break;
      case Layout::kBuffer:
        b.shuffle({.mode = ShuffleMode::kBuffer, .size = 32});
        break;
      case Layout::kShard0:
      case Layout::kShard1:
        b.shard({.rank = layout == Layout::kShard0 ? 0u : 1u, .world = 2})
            .shuffle({.mode = ShuffleMode::kGlobal});
        break;
      case Layout::kPack:
        b.map(to_tokens, {.name = "tokens"}).pack({.length = 16, .field = "tokens"});
        break;
    }
    return b.batch({.size = 4}).build();
  }
  /// Document i (record i) as tokens: (i * 7) % 13 of them (some empty), token j = i * 100 + j.
  static void to_tokens(Sample& s, MapContext&) {
    const std::uint64_t i = record_index(static_cast<const std::byte*>(s.at("data").data()));
    const auto n = static_cast<std::int32_t>((i * 7) % 13);
    Tensor t(DType::kInt32, Shape{n});
    auto v = t.values<std::int32_t>();
    for (std::int32_t j = 0; j < n; ++j) v[j] = static_cast<std::int32_t>(i * 100 + j);
    s.erase("data");
    s.set("tokens", t);
  }
  /// The records (or, packed, the tokens) of the batches from now on in `epoch`.
  static std::vector<std::uint64_t> items_rest(Loader& l, std::uint64_t epoch, bool packed) {
    std::vector<std::uint64_t> out;
    while (auto b = l.next()) {
      EXPECT_EQ(b->info.epoch, epoch);
      if (packed) {
        for (auto x : (*b)["tokens"].values<std::int32_t>())
          out.push_back(static_cast<std::uint64_t>(x));
      } else {
        Delivered d;
        append(d, *b);
        out.insert(out.end(), d.ids.begin(), d.ids.end());
      }
      if (b->info.is_last_in_epoch) break;
    }
    return out;
  }
  /// Epoch `epoch` of a fresh pipeline `layout` over the files in data/ now.
  std::vector<std::uint64_t> fresh(Layout layout, std::uint64_t epoch) const {
    Loader l(make(layout), {.epochs = epoch + 1});
    std::vector<std::uint64_t> out;
    for (std::uint64_t e = 0; e <= epoch; ++e) {
      auto items = items_rest(l, e, layout == Layout::kPack);
      if (e == epoch) out = std::move(items);
    }
    return out;
  }
  static void append(Delivered& d, const Batch& b) {
    const Tensor& t = b["data"];
    for (std::int64_t i = 0; i < t.shape()[0]; ++i) {
      d.ids.push_back(record_index(static_cast<const std::byte*>(t.data()) + i * 16));
      d.epochs.push_back(b.info.epoch);
    }
  }
  static void take_rows(Loader& l, std::size_t batches) {
    for (std::size_t k = 0; k < batches; ++k) ASSERT_TRUE(l.next());
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

/// A file removed mid-epoch under nodes that address the source by position (a global or
/// buffer shuffle, a shard of two ranks before a shuffle): the rest of the epoch is the
/// uninterrupted run's less the removed file's records, in order; every kept record once; the
/// next epoch a fresh pipeline's over the kept files; the history lists the removal.
class FileRemovedTest : public FileChangeTest,
                        public ::testing::WithParamInterface<FileChangeTest::Layout> {};

TEST_P(FileRemovedTest, TheRestOfTheEpochIsTheUninterruptedRunLessTheRemovedFile) {
  const Layout layout = GetParam();
  for (int k : {0, 1, 2, 3}) add(k);
  Loader a(make(layout), {.epochs = 2});
  const Delivered before = take(a, 7);  // 28 records, of every file (shuffled)
  const std::string state = a.state();
  const std::vector<std::uint64_t> old_rest = epoch_rest(a, 0);

  remove(2);
  Loader b(make(layout), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
  b.load_state(state);
  const std::vector<std::uint64_t> rest = epoch_rest(b, 0);
  std::vector<std::uint64_t> expected;
  for (auto id : old_rest)
    if (file_of(id) != 2) expected.push_back(id);
  EXPECT_EQ(rest, expected);
  EXPECT_LT(expected.size(), old_rest.size());  // the removed file had records left to skip

  std::vector<std::uint64_t> epoch0 = before.ids;
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  const bool sharded = layout == Layout::kShard0 || layout == Layout::kShard1;
  if (!sharded) {
    expect_exactly_once(epoch0, {0, 1, 3});
    std::size_t of_removed = 0;  // file 2's records delivered before the removal
    for (auto id : before.ids) of_removed += file_of(id) == 2 ? 1 : 0;
    EXPECT_EQ(epoch0.size(), 150u + of_removed);
  }

  const std::vector<std::uint64_t> epoch1 = epoch_rest(b, 1);
  EXPECT_EQ(epoch1, fresh(layout, 1));
  if (!sharded) expect_exactly_once(epoch1, {0, 1, 3});

  const PipelineState s = b.state_struct();
  ASSERT_EQ(s.data_changes.size(), 1u);
  EXPECT_EQ(s.data_changes[0].step, 7u);
  EXPECT_NE(s.data_changes[0].what.find("/data/part-00002.bin removed: its 50 records are "
                                        "skipped where 'shuffle' has not yet delivered them in "
                                        "epoch 0"),
            std::string::npos)
      << s.data_changes[0].what;
}

INSTANTIATE_TEST_SUITE_P(Layouts, FileRemovedTest,
                         ::testing::Values(FileChangeTest::Layout::kGlobal,
                                           FileChangeTest::Layout::kBuffer),
                         [](const auto& info) {
                           return info.param == FileChangeTest::Layout::kGlobal ? "GlobalShuffle"
                                                                                : "BufferShuffle";
                         });

TEST_F(FileChangeTest, AFileRemovedUnderAShardOfTwoRanksKeepsTheRanksDisjoint) {
  for (int k : {0, 1, 2, 3}) add(k);
  std::vector<std::string> states;
  std::vector<Delivered> before(2);
  std::vector<std::vector<std::uint64_t>> old_rest(2);
  std::vector<std::unique_ptr<Loader>> runs;
  for (int r = 0; r < 2; ++r) {
    const Layout layout = r == 0 ? Layout::kShard0 : Layout::kShard1;
    runs.push_back(std::make_unique<Loader>(make(layout), LoaderOptions{.epochs = 2}));
    before[r] = take(*runs[r], 5);
    states.push_back(runs[r]->state());
    old_rest[r] = epoch_rest(*runs[r], 0);
  }
  remove(2);
  std::vector<std::uint64_t> epoch0, epoch1;
  for (int r = 0; r < 2; ++r) {
    const Layout layout = r == 0 ? Layout::kShard0 : Layout::kShard1;
    Loader b(make(layout), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
    b.load_state(states[r]);
    const std::vector<std::uint64_t> rest = epoch_rest(b, 0);
    std::vector<std::uint64_t> expected;
    for (auto id : old_rest[r])
      if (file_of(id) != 2) expected.push_back(id);
    EXPECT_EQ(rest, expected) << "rank " << r;
    epoch0.insert(epoch0.end(), before[r].ids.begin(), before[r].ids.end());
    epoch0.insert(epoch0.end(), rest.begin(), rest.end());
    const std::vector<std::uint64_t> next = epoch_rest(b, 1);
    EXPECT_EQ(next, fresh(layout, 1)) << "rank " << r;
    epoch1.insert(epoch1.end(), next.begin(), next.end());
    const PipelineState s = b.state_struct();
    ASSERT_EQ(s.data_changes.size(), 1u);
    EXPECT_NE(s.data_changes[0].what.find("/data/part-00002.bin removed: its 50 records are "
                                          "skipped where 'shard' has not yet delivered them"),
              std::string::npos)
        << s.data_changes[0].what;
  }
  // The two ranks together: every kept record once (200 records divide by 2: no padding).
  expect_exactly_once(epoch0, {0, 1, 3});
  expect_exactly_once(epoch1, {0, 1, 3});
  EXPECT_EQ(epoch1.size(), 150u);
}

TEST_F(FileChangeTest, AFileRemovedUnderPackSkipsItsDocumentsNotYetPacked) {
  for (int k : {0, 1, 2, 3}) add(k);
  // The epoch's token stream: documents 0..199 in order (to_tokens).
  auto stream = [](const std::set<int>& files) {
    std::vector<std::uint64_t> s;
    for (std::uint64_t i = 0; i < 200; ++i) {
      if (!files.contains(file_of(i))) continue;
      for (std::uint64_t j = 0; j < (i * 7) % 13; ++j) s.push_back(i * 100 + j);
    }
    return s;
  };
  Loader a(make(Layout::kPack), {.epochs = 2});
  std::vector<std::uint64_t> before;
  for (int k = 0; k < 11; ++k) {  // 704 tokens: 5 short of document 118's end (file 2)
    auto b = a.next();
    ASSERT_TRUE(b);
    for (auto x : (*b)["tokens"].values<std::int32_t>()) before.push_back(std::uint64_t(x));
  }
  const std::string state = a.state();
  const std::vector<std::uint64_t> old_rest = items_rest(a, 0, true);
  const std::uint64_t carry_doc = before.back() / 100;
  ASSERT_EQ(file_of(carry_doc), 2);  // pack is inside a document of the file removed

  remove(2);
  Loader b(make(Layout::kPack), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
  b.load_state(state);
  const std::vector<std::uint64_t> rest = items_rest(b, 0, true);
  // The uninterrupted rest less the removed file's tokens, cut into whole rows.
  std::vector<std::uint64_t> expected;
  for (auto x : old_rest)
    if (file_of(x / 100) != 2) expected.push_back(x);
  const std::vector<std::uint64_t> all = stream({0, 1, 2, 3});
  for (std::size_t i = before.size() + old_rest.size(); i < all.size(); ++i)
    if (file_of(all[i] / 100) != 2) expected.push_back(all[i]);  // the dropped partial row's
  expected.resize(expected.size() / 16 * 16);
  EXPECT_EQ(rest, expected);
  // No token twice, none of a kept document lost (but the epoch's last partial row).
  std::vector<std::uint64_t> epoch0 = before;
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  std::set<std::uint64_t> seen(epoch0.begin(), epoch0.end());
  EXPECT_EQ(seen.size(), epoch0.size());
  std::size_t kept = 0;
  for (auto x : stream({0, 1, 3})) kept += seen.contains(x) ? 1 : 0;
  EXPECT_GT(kept + 16, stream({0, 1, 3}).size());

  // The next epoch: a fresh pipeline's over the kept files.
  EXPECT_EQ(items_rest(b, 1, true), fresh(Layout::kPack, 1));
  const PipelineState s = b.state_struct();
  ASSERT_EQ(s.data_changes.size(), 1u);
  EXPECT_NE(s.data_changes[0].what.find("pack: of files removed, the rest of document 0:" +
                                        std::to_string(carry_doc)),
            std::string::npos)
      << s.data_changes[0].what;
  EXPECT_NE(s.data_changes[0].what.find("documents pulled and not started skipped in epoch 0"),
            std::string::npos)
      << s.data_changes[0].what;
}

/// The save/restore oracle over a run resumed with a file removed under a shuffle: a save at
/// every step of it, up to and across the changed epoch's end, resumes to the same stream.
TEST_F(FileChangeTest, TheOracleHoldsAtEveryStepOfARunThatContinuedOverARemoval) {
  for (int k : {0, 1, 2}) add(k);
  for (Layout layout : {Layout::kGlobal, Layout::kShard1, Layout::kPack}) {
    std::string state;
    {
      Loader a(make(layout), {.epochs = 2});
      take_rows(a, 6);
      state = a.state();
    }
    remove(1);
    const testing::OracleReport r = testing::check_save_restore_from(
        [&] { return make(layout); }, {.epochs = 2, .on_data_change = OnDataChange::kContinue},
        state);
    EXPECT_TRUE(r.ok()) << r.summary();
    EXPECT_GT(r.batches, 10u);
    add(1);
  }
}

TEST_F(FileChangeTest, ALaterResumeOfARunThatContinuedOverARemovalUnderAShuffleReplaysIt) {
  for (int k : {0, 1, 2}) add(k);
  Loader a(make(Layout::kGlobal), {.epochs = 2});
  take(a, 5);
  const std::string state = a.state();
  remove(0);
  Loader b(make(Layout::kGlobal), {.epochs = 2, .on_data_change = OnDataChange::kContinue});
  b.load_state(state);
  take(b, 4);
  const std::string mid = b.state();  // within epoch 0, after the change
  const Delivered tail = take(b, 40);
  Loader c(make(Layout::kGlobal), {.epochs = 2});  // the same files: no opt-in needed
  c.load_state(mid);
  const Delivered again = take(c, 40);
  EXPECT_EQ(again.ids, tail.ids);
  EXPECT_EQ(again.epochs, tail.epochs);
  EXPECT_EQ(c.state_struct().data_changes.size(), 1u);
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
