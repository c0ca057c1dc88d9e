// The example plugin's nodes after batch (examples/plugin/batch_stages.cpp) — `slice`, a stage
// in the spine like shard after batch, and `checksum`, a batch-time stage like device_copy —
// compiled into this test as C++ pipeline nodes: what they do, where they may stand, and the
// library's save/restore oracle (tools/testing.h). The plugin library itself runs under
// `flowstate verify` in tests/cli/plugin_test.cpp.
#include "examples/plugin/batch_stages.h"

#include <gtest/gtest.h>

#include <cstring>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/tools/testing.h"
#include "tests/examples/batches.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using examples::checksum_node;
using examples::ChecksumOptions;
using examples::slice_node;
using examples::SliceOptions;
using examples_test::indices;
using testing::TempDir;

/// 100 records of 16 bytes in 2 files, shuffled.
class BatchStagesTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 100, 16, 2); }
  Pipeline::Builder shuffled() const {
    Pipeline::Builder b;
    b.seed(9)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 32});
    return b;
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(BatchStagesTest, SliceKeepsTheFirstCountSamplesOfEveryBatch) {
  Loader whole(shuffled().batch({.size = 8}).build(), {.epochs = 2});
  Loader sliced(shuffled().batch({.size = 8}).add(slice_node(), SliceOptions{.count = 3}).build(),
                {.epochs = 2});
  std::size_t batches = 0;
  while (auto w = whole.next()) {
    auto s = sliced.next();
    ASSERT_TRUE(s);
    const auto all = indices(*w);
    const auto kept = indices(*s);
    // The short last batch of an epoch (100 = 12 × 8 + 4) is cut to 3 as well.
    ASSERT_EQ(kept.size(), std::min<std::size_t>(3, all.size())) << batches;
    EXPECT_EQ(kept, std::vector<std::uint64_t>(all.begin(), all.begin() + kept.size()));
    EXPECT_EQ(s->info.num_samples, kept.size());
    EXPECT_EQ(s->info.is_last_in_epoch, w->info.is_last_in_epoch);
    EXPECT_EQ(s->info.step, w->info.step);
    ++batches;
  }
  EXPECT_FALSE(sliced.next());
  EXPECT_EQ(batches, 26u);  // 13 batches per epoch
}

TEST_F(BatchStagesTest, SlicePassesTheSaveRestoreOracle) {
  auto make = [&] {
    return shuffled().batch({.size = 7}).add(slice_node(), SliceOptions{.count = 5}).build();
  };
  const testing::OracleReport r =
      testing::check_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.batches, 30u);  // 15 batches per epoch
}

TEST_F(BatchStagesTest, SliceStandsRightAfterBatchAndKeepsAtMostABatch) {
  try {
    shuffled()
        .batch({.size = 8})
        .prefetch({.depth = 2})
        .add(slice_node(), SliceOptions{.count = 3})
        .build();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "'slice' after batch must follow it directly (it chooses which samples each "
                 "batch reads)");
  }
  try {
    shuffled().batch({.size = 8}).add(slice_node(), SliceOptions{.count = 9}).build();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "slice.count");
    EXPECT_STREQ(e.what(),
                 "'slice' keeps 9 samples of every batch, but batches have 8 (batch.size)");
  }
  try {
    shuffled().add(slice_node(), SliceOptions{.count = 3}).batch({.size = 8}).build();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "'slice' after batch must follow it directly (it chooses which samples each "
                 "batch reads)");
  }
}

TEST_F(BatchStagesTest, ChecksumAddsEveryBatchsDigest) {
  Loader plain(shuffled().batch({.size = 8}).build(), {.epochs = 1});
  Loader summed(shuffled().batch({.size = 8}).add(checksum_node(), ChecksumOptions{}).build(),
                {.epochs = 1});
  std::size_t batches = 0;
  while (auto p = plain.next()) {
    auto s = summed.next();
    ASSERT_TRUE(s);
    const Tensor& c = (*s)["checksum"];
    ASSERT_EQ(c.dtype(), DType::kUInt64);
    std::uint64_t got = 0;
    std::memcpy(&got, c.data(), sizeof(got));
    EXPECT_EQ(got, p->digest()) << batches;
    EXPECT_EQ(indices(*s), indices(*p));
    ++batches;
  }
  EXPECT_EQ(batches, 13u);
}

TEST_F(BatchStagesTest, ChecksumAfterSlicePassesTheSaveRestoreOracle) {
  auto make = [&] {
    return shuffled()
        .batch({.size = 6})
        .add(slice_node(), SliceOptions{.count = 4})
        .prefetch({.depth = 3})
        .add(checksum_node(), ChecksumOptions{.field = "sum"})
        .build();
  };
  const testing::OracleReport r =
      testing::check_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.batches, 34u);  // 17 batches per epoch
}

TEST_F(BatchStagesTest, ABatchTimeStageIsCountedAsItsNodesDeliverStage) {
  Loader l(shuffled().batch({.size = 8}).add(checksum_node(), ChecksumOptions{}).build(),
           {.epochs = 1, .node_stats = true});
  while (l.next()) {
  }
  bool found = false;
  for (const auto& n : l.stats().nodes)
    if (n.name == "checksum") {
      found = true;
      EXPECT_EQ(n.stage, "deliver");
      EXPECT_EQ(n.items, 100u);
      EXPECT_EQ(n.calls, 13u);
    }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace flowstate
