// `filter` and the planner's look-ahead over upstreams of unknown length.
#include "flowstate/nodes/filter.h"
#include "flowstate/nodes/builtin.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/sources/lines.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::drain;
using testing::record_index;
using testing::TempDir;

std::uint64_t index_of(const Sample& s) {
  return record_index(static_cast<const std::byte*>(s.at("data").data()));
}

std::vector<std::uint64_t> indices(const Batch& b) {
  const Tensor& t = b["data"];
  std::vector<std::uint64_t> out;
  for (std::int64_t i = 0; i < t.shape()[0]; ++i)
    out.push_back(record_index(static_cast<const std::byte*>(t.data()) + i * t.shape()[1]));
  return out;
}

class FilterTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 100, 16, 2); }
  Pipeline::Builder base() const {
    Pipeline::Builder b;
    b.seed(99).records({.paths = {glob_}, .record_bytes = 16});
    return b;
  }
  TempDir dir_;
  std::string glob_;
};

TEST(FilterLengthRule, IsDecidedFromViewsWithoutReadingAndResumesExactly) {
  // Line i holds i % 9 bytes: lines of 3 to 6 bytes are kept. The predicate throws, so any
  // record it were asked about would fail the run: every decision comes from the view.
  TempDir dir;
  {
    std::ofstream f(dir / "docs.txt");
    for (int i = 0; i < 90; ++i)
      f << std::string(static_cast<std::size_t>(i % 9), 'a' + i % 26) << "\n";
  }
  auto make = [&](bool map_before) {
    Pipeline::Builder b;
    b.seed(4)
        .add(lines_node(), LinesOptions{.paths = {dir / "docs.txt"}, .field = "text"})
        .shuffle({.mode = ShuffleMode::kGlobal});
    if (map_before) b.map([](Sample&, MapContext&) {}, {.name = "identity"});
    FilterOptions o{.name = "length"};
    o.by_length = LengthRule{.field = field_id("text"), .min = 3, .max = 6};
    b.filter(
        [map_before](const Sample& s, MapContext&) {
          if (!map_before) throw Error("read a record the view could decide");
          const auto n = s.at("text").numel();
          return n >= 3 && n <= 6;
        },
        std::move(o));
    return b.batch({.size = 4, .collate = CollateMode::kRagged}).build();
  };
  std::vector<std::uint64_t> viewed_digests, read_digests;
  Loader viewed(make(false), {.epochs = 1});
  Loader read(make(true), {.epochs = 1});
  for (auto* l : {&viewed, &read})
    while (auto b = l->next())
      (l == &viewed ? viewed_digests : read_digests).push_back(b->digest());
  EXPECT_EQ(viewed_digests, read_digests);
  EXPECT_EQ(viewed_digests.size(), 10u);  // 40 of 90 lines have 3 to 6 bytes
  testing::expect_save_restore([&] { return make(false); }, {.epochs = 2, .workers = 1},
                               {.epochs = 2, .workers = 2});
}

TEST_F(FilterTest, DropsRejectedSamplesAndKeepsBatchesFull) {
  Pipeline p = base()
                   .filter([](const Sample& s, MapContext&) { return index_of(s) % 3 != 0; },
                           {.name = "not_thirds"})
                   .batch({.size = 8})
                   .build();
  Loader l(p, {.epochs = 1});
  std::vector<std::uint64_t> seen;
  std::vector<Batch> batches;
  while (auto b = l.next()) batches.push_back(*b);
  // 100 records, 34 multiples of 3 dropped: 66 kept = 8 full batches + 2.
  ASSERT_EQ(batches.size(), 9u);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const auto& b = batches[i];
    for (auto x : indices(b)) seen.push_back(x);
    EXPECT_EQ(b.info.index_in_epoch, i);
    EXPECT_EQ(b.info.is_last_in_epoch, i == 8);
    EXPECT_EQ(b.info.num_samples, i == 8 ? 2u : 8u);
    EXPECT_EQ(b.info.remainder, i == 8 ? 2u : 0u);
    // Unknown length: the count is known only with the last batch.
    if (i == 8)
      EXPECT_EQ(b.info.batches_in_epoch, std::optional<std::uint64_t>(9));
    else
      EXPECT_FALSE(b.info.batches_in_epoch.has_value());
  }
  std::vector<std::uint64_t> want;
  for (std::uint64_t i = 0; i < 100; ++i)
    if (i % 3 != 0) want.push_back(i);
  EXPECT_EQ(seen, want);
}

TEST_F(FilterTest, LastBatchIsMarkedWhenTheTailIsFilteredAway) {
  // Everything after record 41 is dropped: the batch holding 40 and 41 is the last one, which
  // the planner knows only by looking one batch ahead.
  Pipeline p = base()
                   .filter([](const Sample& s, MapContext&) { return index_of(s) < 42; })
                   .batch({.size = 8})
                   .build();
  Loader l(p, {.epochs = 2});
  auto all = drain(l);
  ASSERT_EQ(all.size(), 12u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].last, i % 6 == 5) << i;
    EXPECT_EQ(all[i].epoch, i / 6);
    EXPECT_EQ(all[i].remainder, i % 6 == 5 ? 2u : 0u);
  }
}

TEST_F(FilterTest, DropLastDropsTheShortTailOfAnUnknownLengthEpoch) {
  Pipeline p = base()
                   .filter([](const Sample& s, MapContext&) { return index_of(s) < 42; })
                   .batch({.size = 8, .drop_last = true})
                   .build();
  Loader l(p, {.epochs = 1});
  auto all = drain(l);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_TRUE(all.back().last);
  EXPECT_EQ(all.back().remainder, 0u);
}

TEST_F(FilterTest, DroppingAWholeBatchWorthKeepsPositionsExact) {
  // Records 16..63 — six batches' worth — are dropped in the middle of the epoch.
  auto make = [&] {
    return base()
        .shuffle({.mode = ShuffleMode::kGlobal})
        .filter([](const Sample& s, MapContext&) {
          auto i = index_of(s);
          return i < 16 || i >= 64;
        })
        .batch({.size = 8})
        .build();
  };
  Loader l(make(), {.epochs = 1});
  std::size_t n = 0;
  while (auto b = l.next())
    for (auto x : indices(*b)) {
      EXPECT_TRUE(x < 16 || x >= 64) << x;
      ++n;
    }
  EXPECT_EQ(n, 52u);
  testing::expect_save_restore(make, {.epochs = 3, .workers = 1}, {.epochs = 3, .workers = 2});
}

TEST_F(FilterTest, SeesEarlierMapsAndPassesTheSaveRestoreOracle) {
  auto make = [&] {
    return base()
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 10})
        .map(
            [](Sample& s, MapContext& ctx) {
              Tensor t(DType::kUInt64, Shape{});
              t.values<std::uint64_t>()[0] = ctx.rng.below(4);
              s.set("coin", t);
            },
            {.name = "coin"})
        .filter([](const Sample& s,
                   MapContext&) { return s.at("coin").values<std::uint64_t>()[0] != 0; },
                {.name = "heads"})
        .batch({.size = 7})
        .build();
  };
  // The filter saw the map's output: no batch holds a dropped value.
  Loader l(make(), {.epochs = 1});
  while (auto b = l.next())
    for (auto c : (*b)["coin"].values<std::uint64_t>()) EXPECT_NE(c, 0u);
  testing::expect_save_restore(make, {.epochs = 3, .workers = 1}, {.epochs = 3, .workers = 4});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 3}, {.epochs = 2, .workers = 1});
}

/// A map that counts its calls and the copies of itself (issue 26: alternating maps and filters
/// made each filter's reader copy every map before it, and apply every one of them again).
struct CountingMap {
  static inline std::atomic<std::uint64_t> calls{0}, copies{0};
  std::uint64_t k = 0;  ///< the map's position: the sample's "n" must be k when it arrives
  CountingMap(std::uint64_t position) : k(position) {}
  CountingMap(const CountingMap& o) : k(o.k) { ++copies; }
  CountingMap(CountingMap&&) noexcept = default;
  void operator()(Sample& s, MapContext&) const {
    ++calls;
    const std::uint64_t n = s.find(field_id("n")) ? s.at("n").values<std::uint64_t>()[0] : 0;
    if (n != k) throw Error("map " + std::to_string(k) + " got a sample at " + std::to_string(n));
    Tensor t(DType::kUInt64, Shape{});
    t.values<std::uint64_t>()[0] = n + 1;
    s.set("n", t);
  }
};

TEST_F(FilterTest, AlternatingMapsAndFiltersApplyEachMapOncePerSampleInTheSpine) {
  // n maps, each followed by a filter that checks the sample went through exactly the maps
  // before it and drops odd records at the first one. Each filter starts from the sample the
  // filter before it kept, so each map runs once per record in the spine (plus once in the
  // assembler per delivered sample), not once per later filter; and no filter copies the
  // maps before it.
  auto make = [&](std::uint64_t n) {
    Pipeline::Builder b = base();
    b.shuffle({.mode = ShuffleMode::kGlobal});
    for (std::uint64_t k = 0; k < n; ++k) {
      b.map(CountingMap(k), {.name = "m" + std::to_string(k)});
      b.filter(
          [k](const Sample& s, MapContext&) {
            if (s.at("n").values<std::uint64_t>()[0] != k + 1)
              throw Error("filter " + std::to_string(k) + " saw the wrong maps");
            return k != 0 || index_of(s) % 2 == 0;
          },
          {.name = "f" + std::to_string(k)});
    }
    return b.batch({.size = 8}).build();
  };
  auto per_map_copies = [&](std::uint64_t n) {
    const Pipeline p = make(n);
    CountingMap::copies = 0;
    Loader l(p, {.epochs = 1, .workers = 2});
    (void)l.next();
    return static_cast<double>(CountingMap::copies.load()) / static_cast<double>(n);
  };
  // Copies per map do not grow with the filters after it (main: 2 + the filters after it).
  EXPECT_EQ(per_map_copies(40), per_map_copies(160));

  constexpr std::uint64_t kN = 100;
  CountingMap::calls = 0;
  Loader l(make(kN), {.epochs = 1, .workers = 2});
  std::uint64_t delivered = 0;
  while (auto b = l.next()) {
    for (auto v : (*b)["n"].values<std::uint64_t>()) EXPECT_EQ(v, kN);
    for (auto x : indices(*b)) EXPECT_EQ(x % 2, 0u);
    delivered += b->info.num_samples;
  }
  EXPECT_EQ(delivered, 50u);
  // 100 records through map 0, 50 through the rest, 50 delivered through all: 10 050 calls
  // plus what the read-ahead of the first filter decided twice; once per later filter: 252 575.
  EXPECT_LE(CountingMap::calls.load(), 3 * kN * 100) << "maps re-run for every later filter";
  testing::expect_save_restore([&] { return make(12); }, {.epochs = 2, .workers = 1},
                               {.epochs = 2, .workers = 3});
}

TEST_F(FilterTest, SkipsAcrossAnUnknownLengthEpochKeepLastExact) {
  auto make = [&] {
    return base()
        .filter([](const Sample& s, MapContext&) { return index_of(s) % 2 == 0; })
        .batch({.size = 8})
        .build();
  };
  // 50 kept: batches 0..6, the last (6) holds 2. Skipping 5..6 makes 4 the last delivered.
  Loader l(make(), {.epochs = 2});
  l.skip(5, 6);
  auto all = drain(l);
  ASSERT_EQ(all.size(), 12u);
  EXPECT_TRUE(all[4].last);
  EXPECT_EQ(all[4].step, 4u);
  EXPECT_EQ(all[5].step, 7u);
  EXPECT_EQ(all[5].epoch, 1u);
}

TEST_F(FilterTest, AnEpochFilteredToNothingEndsARunForever) {
  Pipeline p =
      base().filter([](const Sample&, MapContext&) { return false; }).batch({.size = 4}).build();
  Loader l(p, {.epochs = 0});
  EXPECT_FALSE(l.next().has_value());
}

TEST_F(FilterTest, PredicateErrorsNameTheFilter) {
  Pipeline p = base()
                   .filter(
                       [](const Sample& s, MapContext&) -> bool {
                         if (index_of(s) == 37) throw DataError("", DataError::kNoOffset, "bad 37");
                         return true;
                       },
                       {.name = "picky"})
                   .batch({.size = 8})
                   .build();
  Loader l(p, {.epochs = 1});
  try {
    drain(l);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("picky"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad 37"), std::string::npos) << e.what();
  }
}

TEST_F(FilterTest, DecidesAheadInParallelOverAnIndexedUpstream) {
  // A predicate that reads (here: slow) is decided for a window of the upstream's next Refs at
  // once over a global shuffle (random access), even when batches are small; over a buffer
  // shuffle (no random access) a chunk of 4 is decided one by one. Either way each record is
  // decided once (a window given up would be decided again).
  auto run = [&](ShuffleMode mode) {
    testing::ConcurrencyProbe probe(mode == ShuffleMode::kGlobal);
    std::atomic<int> calls{0};
    std::vector<std::uint64_t> kept;
    ShuffleOptions shuffle{.mode = mode};
    if (mode == ShuffleMode::kBuffer) shuffle.size = 10;
    Pipeline p = base()
                     .shuffle(shuffle)
                     .filter(
                         [&](const Sample& s, MapContext&) {
                           ++calls;
                           probe.call(std::chrono::microseconds(300));
                           return index_of(s) % 3 != 0;
                         },
                         {.name = "slow"})
                     .batch({.size = 4})
                     .build();
    Loader l(p, {.epochs = 1, .workers = 2});
    while (auto b = l.next())
      for (auto x : indices(*b)) kept.push_back(x);
    std::sort(kept.begin(), kept.end());
    std::vector<std::uint64_t> want;
    for (std::uint64_t i = 0; i < 100; ++i)
      if (i % 3 != 0) want.push_back(i);
    EXPECT_EQ(kept, want);
    EXPECT_EQ(calls.load(), 100);
    return probe.most();
  };
  EXPECT_GE(run(ShuffleMode::kGlobal), 2);
  EXPECT_EQ(run(ShuffleMode::kBuffer), 1);
}

TEST_F(FilterTest, AnErrorDecidedAheadStopsWhereItIsPulled) {
  // Record 37's predicate throws; records decided ahead after it change nothing: the batches
  // before the error are those of a run whose predicate never throws, up to where 37 is needed.
  auto make = [&](bool fail) {
    return base()
        .shuffle({.mode = ShuffleMode::kGlobal})
        .filter(
            [fail](const Sample& s, MapContext&) -> bool {
              if (fail && index_of(s) == 37) throw DataError("", DataError::kNoOffset, "bad 37");
              return index_of(s) % 2 == 0;
            },
            {.name = "picky"})
        .batch({.size = 2})
        .build();
  };
  Loader whole(make(false), {.epochs = 1});
  std::vector<std::vector<std::uint64_t>> want;
  while (auto b = whole.next()) want.push_back(indices(*b));
  for (int workers : {1, 2}) {
    Loader l(make(true), {.epochs = 1, .workers = workers});
    std::vector<std::vector<std::uint64_t>> got;
    try {
      while (auto b = l.next()) got.push_back(indices(*b));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad 37"), std::string::npos) << e.what();
    }
    ASSERT_LT(got.size(), want.size());
    EXPECT_EQ(got,
              std::vector(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(got.size())));
  }
}

TEST(FilterStateVersions, AVersion1StateLeavesThePositionUnknown) {
  // Version 1 held (epoch, dropped); a filter restored from it decides what it pulls (no
  // window) until its next epoch, when its position is known again.
  std::ostringstream os;
  {
    OutArchive ar(os);
    FilterState old{.epoch = 3, .dropped = 7, .consumed = 99};
    old.serialize(ar, 1);
  }
  std::istringstream is(os.str());
  InArchive ar(is);
  FilterState s;
  s.serialize(ar, 1);
  EXPECT_EQ(s.epoch, 3u);
  EXPECT_EQ(s.dropped, 7u);
  EXPECT_EQ(s.consumed, kUnknownSize);
}

TEST_F(FilterTest, NameAndParamsEnterTheFingerprint) {
  auto fp = [&](std::string name) {
    return base()
        .filter([](const Sample&, MapContext&) { return true; }, {.name = std::move(name)})
        .batch({.size = 4})
        .build()
        .fingerprint();
  };
  EXPECT_NE(fp("a"), fp("b"));
  EXPECT_EQ(fp("a"), fp("a"));
}

}  // namespace
}  // namespace flowstate
