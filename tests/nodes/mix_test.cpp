// `mix`: weighted sampling from input pipelines, every stop criterion, exact O(1) resume.
#include "flowstate/nodes/mix.h"
#include "flowstate/nodes/builtin.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::drain;
using testing::record_index;
using testing::TempDir;

class MixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = testing::write_records(dir_ / "a", 40, 16, 2);
    b_ = testing::write_records(dir_ / "b", 120, 16, 3);
  }
  /// Input `glob`, tagged: every sample gets field "from" = tag.
  Pipeline input(const std::string& glob, std::uint8_t tag, bool shuffle = true) const {
    Pipeline::Builder b;
    b.seed(tag).records({.paths = {glob}, .record_bytes = 16});
    if (shuffle) b.shuffle({.mode = ShuffleMode::kGlobal});
    b.map(
        [tag](Sample& s, MapContext&) {
          Tensor t(DType::kUInt8, Shape{});
          t.values<std::uint8_t>()[0] = tag;
          s.set("from", t);
        },
        {.name = "tag" + std::to_string(tag)});
    return b.build_input();
  }
  Pipeline mixed(MixStop stop, std::vector<double> w = {1, 1}) const {
    return Pipeline::Builder()
        .seed(77)
        .mix({input(a_, 0), input(b_, 1)}, {.weights = std::move(w), .stop = stop})
        .batch({.size = 8})
        .build();
  }
  /// (input, record) of every sample of one epoch.
  static std::vector<std::pair<int, std::uint64_t>> samples(Loader& l, std::size_t batches) {
    std::vector<std::pair<int, std::uint64_t>> out;
    for (std::size_t k = 0; k < batches; ++k) {
      auto b = l.next();
      if (!b) break;
      const Tensor& d = (*b)["data"];
      auto from = (*b)["from"].values<std::uint8_t>();
      for (std::int64_t i = 0; i < d.shape()[0]; ++i)
        out.emplace_back(from[i], record_index(static_cast<const std::byte*>(d.data()) + i * 16));
      if (b->info.is_last_in_epoch) break;
    }
    return out;
  }
  TempDir dir_;
  std::string a_, b_;
};

TEST_F(MixTest, AllExhaustedTakesEverySampleOfEveryInputOnce) {
  Loader l(mixed(MixStop::kAllExhausted, {3, 1}), {.epochs = 1});
  auto got = samples(l, 1000);
  std::map<int, std::set<std::uint64_t>> seen;
  for (auto [in, r] : got) EXPECT_TRUE(seen[in].insert(r).second) << in << ":" << r;
  EXPECT_EQ(seen[0].size(), 40u);
  EXPECT_EQ(seen[1].size(), 120u);
  // Weighted: input 0 (weight 3) is drawn far more often early on.
  int early0 = 0;
  for (std::size_t i = 0; i < 40; ++i) early0 += got[i].first == 0;
  EXPECT_GT(early0, 20);
}

TEST_F(MixTest, StateGrowsWithTheInputsDrawnFromNotWithTheInputs) {
  // Issue 26: every input's nodes were saved in every checkpoint, drawn from or not. An input
  // not pulled since its epoch started is now saved as nothing (or its epoch, under cycle), and
  // a restore starts it again.
  auto make = [&](std::size_t n, MixStop stop) {
    std::vector<Pipeline> inputs;
    for (std::size_t i = 0; i < n; ++i)
      inputs.push_back(input(i % 2 == 0 ? a_ : b_, static_cast<std::uint8_t>(i % 200), i % 3 != 2));
    return Pipeline::Builder()
        .seed(5)
        .mix(std::move(inputs), {.weights = std::vector<double>(n, 1.0), .stop = stop})
        .batch({.size = 8})
        .build();
  };
  Loader l(make(2000, MixStop::kAllExhausted), {.epochs = 1});
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(l.next());
  // 16 samples: at most 16 inputs drawn, each with its nodes' counters (< 200 bytes) and its
  // source's identity (56 bytes and the name per file, up to 3 files). Every input's was saved:
  // 2000 of them, ~700 kB here.
  const std::size_t per_input = 200 + 3 * (56 + (dir_ / "b/part-00000.bin").size());
  EXPECT_LT(l.state_struct().spine.size(), 1024 + 16 * per_input);
  for (MixStop stop : {MixStop::kFirstExhausted, MixStop::kAllExhausted, MixStop::kCycle}) {
    SCOPED_TRACE(mix_stop_name(stop));
    // 40 inputs of 40 or 120 records, 8 samples a batch: most inputs are untouched in the
    // first batches, and under cycle some restart while others never ran.
    testing::expect_save_restore([&] { return make(40, stop); }, {.epochs = 3, .workers = 1},
                                 {.epochs = 3, .workers = 2});
  }
}

TEST_F(MixTest, ExtremeWeightsDrawByTheirRatio) {
  // Equal weights near the top of the double range (whose sum overflows) and subnormal ones
  // (whose sum rounds) draw each input about half the time, as [1, 1] does.
  const std::string c = testing::write_records(dir_ / "c", 1000, 16, 2);
  const std::string d = testing::write_records(dir_ / "d", 1000, 16, 2);
  for (const std::vector<double>& w :
       {std::vector<double>{1e308, 1e308}, std::vector<double>{5e-324, 5e-324},
        std::vector<double>{1, 1}}) {
    Pipeline p = Pipeline::Builder()
                     .seed(77)
                     .mix({input(c, 0), input(d, 1)}, {.weights = w})
                     .batch({.size = 8})
                     .build();
    Loader l(p, {.epochs = 1});
    auto got = samples(l, 100);  // 800 draws: neither input of 1000 can run out
    ASSERT_EQ(got.size(), 800u);
    std::size_t from0 = 0;
    for (auto [in, r] : got) from0 += in == 0;
    const double share = static_cast<double>(from0) / static_cast<double>(got.size());
    EXPECT_GT(share, 0.45) << w[0];
    EXPECT_LT(share, 0.55) << w[0];
  }
}

TEST_F(MixTest, FirstExhaustedEndsTheEpochWhenADrawnInputRunsOut) {
  Loader l(mixed(MixStop::kFirstExhausted), {.epochs = 1});
  auto got = samples(l, 1000);
  int from0 = 0;
  for (auto [in, r] : got) from0 += in == 0;
  EXPECT_EQ(from0, 40);  // input 0 ran out first and ended the epoch
  EXPECT_LT(got.size(), 160u);
}

TEST_F(MixTest, CycleRestartsInputsUntilEveryOneWasExhausted) {
  Loader l(mixed(MixStop::kCycle, {1, 1}), {.epochs = 1});
  auto got = samples(l, 1000);
  std::map<int, int> count;
  for (auto [in, r] : got) ++count[in];
  EXPECT_EQ(count[1], 120);  // the epoch ends when the larger input runs out
  EXPECT_GT(count[0], 40);   // the smaller one went round more than once
}

TEST_F(MixTest, DrawsDependOnlyOnSeedAndPosition) {
  Loader x(mixed(MixStop::kAllExhausted), {.epochs = 2, .workers = 1});
  Loader y(mixed(MixStop::kAllExhausted), {.epochs = 2, .workers = 3});
  EXPECT_EQ(drain(x), drain(y));
}

TEST_F(MixTest, EveryStopCriterionPassesTheSaveRestoreOracle) {
  for (MixStop stop : {MixStop::kFirstExhausted, MixStop::kAllExhausted, MixStop::kCycle}) {
    SCOPED_TRACE(std::string(mix_stop_name(stop)));
    auto make = [&] { return mixed(stop, {2, 1}); };
    testing::expect_save_restore(make, {.epochs = 3, .workers = 1}, {.epochs = 3, .workers = 2});
  }
}

TEST_F(MixTest, StateIsSmallAndHoldsEveryInput) {
  Loader l(mixed(MixStop::kAllExhausted), {.epochs = 1});
  for (int i = 0; i < 10; ++i) l.next();
  const std::string s = l.state();
  // Counters under 1 KiB, plus each source's data identity: 54 bytes per source (with the
  // blob's byte, 8 of size and 32 of header), then 56 bytes, a flags byte, 32 of stat and the name
  // (here an absolute path) per file; 2 sources, 5 files.
  EXPECT_LT(s.size(), 1024u + 2 * 54 + 5 * (89 + (dir_ / "b/part-00000.bin").size()));
  // A pipeline whose inputs differ cannot load it.
  Pipeline other = Pipeline::Builder()
                       .seed(77)
                       .mix({input(a_, 0), input(b_, 1, false)},
                            {.weights = {1, 1}, .stop = MixStop::kAllExhausted})
                       .batch({.size = 8})
                       .build();
  Loader o(other);
  EXPECT_THROW(o.load_state(s), CheckpointError);
}

TEST_F(MixTest, AShardInAnInputSplitsTheRanksAndIsCheckedAgainstTheLauncher) {
  // NodeDef::splits_ranks and check_launch look into a mix's inputs.
  Pipeline::Builder sharded;
  sharded.seed(3).records({.paths = {a_}, .record_bytes = 16}).shard({.rank = 0, .world = 2});
  const Pipeline p = Pipeline::Builder()
                         .seed(77)
                         .mix({sharded.build_input(), input(b_, 1)}, {.weights = {1, 1}})
                         .batch({.size = 8})
                         .build();
  EXPECT_TRUE(p.splits_ranks());
  EXPECT_FALSE(mixed(MixStop::kAllExhausted).splits_ranks());
  EXPECT_NO_THROW(p.check_launch(0, 2));
  try {
    p.check_launch(1, 2);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "shard");
    EXPECT_STREQ(e.what(), "'shard' is rank 0 of 2, but the launcher started rank 1 of 2");
  }
}

TEST_F(MixTest, ValidatesItsOptions) {
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              Pipeline::Builder().mix({input(a_, 0), input(b_, 1)}, {.weights = {1}});
            }).find("mix has 2 inputs but 1 weights"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Pipeline::Builder().mix({input(a_, 0)}, {.weights = {1}});
            }).find("mix needs at least two inputs"),
            std::string::npos);
  EXPECT_NE(message([&] {
              Pipeline p = Pipeline::Builder()
                               .mix({input(a_, 0), input(b_, 1)}, {.weights = {1, -1}})
                               .batch({.size = 2})
                               .build();
              Loader l(p);
            }).find("every weight must be a positive number"),
            std::string::npos);
  // Refused when the pipeline is built, naming the weight: infinite, NaN and zero too.
  for (double w : {HUGE_VAL, std::nan(""), 0.0}) {
    const std::string m = message([&] {
      Pipeline::Builder().mix({input(a_, 0), input(b_, 1)}, {.weights = {1, w}});
    });
    EXPECT_NE(m.find("weights[1] is "), std::string::npos) << m;
    EXPECT_NE(m.find("every weight must be a positive number (finite, > 0)"), std::string::npos)
        << m;
  }
  EXPECT_NE(message([&] {
              Pipeline::Builder()
                  .records({.paths = {a_}, .record_bytes = 16})
                  .batch({.size = 2})
                  .build_input();
            }).find("'batch' cannot be part of a mix input"),
            std::string::npos);
}

}  // namespace
}  // namespace flowstate
