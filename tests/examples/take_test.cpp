// The example plugin's `take` node (examples/plugin/take.cpp), compiled into this test as
// a C++ pipeline node, and checked with the library's save/restore oracle (tools/testing.h).
#include "examples/plugin/take.h"

#include <gtest/gtest.h>

#include <sstream>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/tools/testing.h"
#include "tests/examples/batches.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using examples::take_node;
using examples::TakeNode;
using examples::TakeOptions;
using examples::TakeState;
using examples_test::indices;
using testing::record_index;
using testing::TempDir;

std::uint64_t index_of(const Sample& s) {
  return record_index(static_cast<const std::byte*>(s.at("data").data()));
}

/// The record indices of every epoch's samples, epoch by epoch.
std::vector<std::vector<std::uint64_t>> epochs_of(Pipeline p, std::uint64_t epochs) {
  std::vector<std::vector<std::uint64_t>> out(epochs);
  Loader l(std::move(p), {.epochs = epochs});
  while (auto b = l.next())
    for (auto x : indices(*b)) out[b->info.epoch].push_back(x);
  return out;
}

/// 100 records of 16 bytes in 2 files.
class TakeTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 100, 16, 2); }
  Pipeline::Builder shuffled() const {
    Pipeline::Builder b;
    b.seed(5)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal});
    return b;
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(TakeTest, KeepsTheFirstCountSamplesOfEveryEpoch) {
  const auto all = epochs_of(shuffled().batch({.size = 8}).build(), 2);
  const auto taken = epochs_of(
      shuffled().add(take_node(), TakeOptions{.count = 30}).batch({.size = 8}).build(), 2);
  ASSERT_EQ(taken.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e)
    EXPECT_EQ(taken[e], std::vector<std::uint64_t>(all[e].begin(), all[e].begin() + 30)) << e;
  EXPECT_NE(taken[0], taken[1]);  // each epoch takes from its own shuffle
}

TEST_F(TakeTest, KnowsItsEpochLengthSoTheLastBatchIsMarked) {
  Loader l(shuffled().add(take_node(), TakeOptions{.count = 30}).batch({.size = 8}).build(),
           {.epochs = 1});
  std::vector<BatchInfo> infos;
  while (auto b = l.next()) infos.push_back(b->info);
  ASSERT_EQ(infos.size(), 4u);  // 8 + 8 + 8 + 6
  EXPECT_EQ(infos[0].batches_in_epoch, 4u);
  EXPECT_TRUE(infos[3].is_last_in_epoch);
  EXPECT_EQ(infos[3].num_samples, 6u);
}

TEST_F(TakeTest, PassesTheSaveRestoreOracle) {
  auto make = [&] {
    return shuffled().add(take_node(), TakeOptions{.count = 45}).batch({.size = 7}).build();
  };
  const testing::OracleReport r =
      testing::check_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.batches, 14u);  // 7 batches of 45 samples per epoch
}

TEST_F(TakeTest, PassesTheSaveRestoreOracleAfterAFilterOfUnknownLength) {
  auto make = [&] {
    return shuffled()
        .filter([](const Sample& s, MapContext&) { return index_of(s) % 3 != 0; },
                {.name = "not_thirds"})
        .add(take_node(), TakeOptions{.count = 40})
        .batch({.size = 6})
        .build();
  };
  const testing::OracleReport r =
      testing::check_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST_F(TakeTest, ACountLargerThanTheDataPassesEverything) {
  const auto all = epochs_of(shuffled().batch({.size = 8}).build(), 2);
  EXPECT_EQ(
      epochs_of(shuffled().add(take_node(), TakeOptions{.count = 1000}).batch({.size = 8}).build(),
                2),
      all);
  EXPECT_EQ(all[0].size(), 100u);
}

TEST(TakeNode, RejectsAZeroCount) {
  try {
    Pipeline::Builder().add(take_node(), TakeOptions{});
    FAIL() << "a zero count was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "take.count");
    EXPECT_STREQ(e.what(), "take.count: 0 is out of range (must be at least 1)");
  }
}

TEST(TakeNode, RefusesARestoredStateThatTookMoreThanItsCount) {
  std::ostringstream saved;
  {
    OutArchive ar(saved);
    ar(TakeState{.epoch = 0, .taken = 11});
  }
  TakeNode node("take", 10);
  std::istringstream in(saved.str());
  InArchive ar(in);
  try {
    node.restore(ar);
    FAIL() << "the state was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(), "take state has taken 11 samples, more than its count 10");
  }
}

TEST(TakeNode, InspectDecodesItsState) {
  std::ostringstream saved;
  {
    OutArchive ar(saved);
    ar(TakeState{.epoch = 3, .taken = 7});
  }
  std::istringstream in(saved.str());
  InArchive ar(in);
  EXPECT_EQ(take_node().inspect(ar, {}), R"({"epoch":3,"taken":7})");
}

}  // namespace
}  // namespace flowstate
