// `pack`: token sequences concatenated and cut into fixed rows; exact resume by reference.
#include "flowstate/nodes/pack.h"

#include <gtest/gtest.h>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::drain;
using testing::record_index;
using testing::TempDir;

/// Document i: (i * 7) % 13 tokens (some empty), token j = i * 100 + j.
std::int32_t doc_len(std::uint64_t i) { return static_cast<std::int32_t>((i * 7) % 13); }

void to_tokens(Sample& s, MapContext&) {
  const std::uint64_t i = record_index(static_cast<const std::byte*>(s.at("data").data()));
  Tensor t(DType::kInt32, Shape{doc_len(i)});
  auto v = t.values<std::int32_t>();
  for (std::int32_t j = 0; j < doc_len(i); ++j) v[j] = static_cast<std::int32_t>(i * 100 + j);
  s.erase("data");
  s.set("tokens", t);
}

std::vector<std::int32_t> rows_of(Loader& l) {
  std::vector<std::int32_t> out;
  while (auto b = l.next())
    for (auto x : (*b)["tokens"].values<std::int32_t>()) out.push_back(x);
  return out;
}

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 60, 16, 2); }
  Pipeline::Builder base() const {
    Pipeline::Builder b;
    b.seed(5).records({.paths = {glob_}, .record_bytes = 16}).map(to_tokens, {.name = "tokens"});
    return b;
  }
  /// The token stream pack must cut: documents in order, each followed by `sep` if >= 0.
  static std::vector<std::int32_t> stream(std::int64_t sep) {
    std::vector<std::int32_t> s;
    for (std::uint64_t i = 0; i < 60; ++i) {
      for (std::int32_t j = 0; j < doc_len(i); ++j)
        s.push_back(static_cast<std::int32_t>(i * 100 + j));
      if (sep >= 0) s.push_back(static_cast<std::int32_t>(sep));
    }
    return s;
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(PackTest, CutsTheConcatenatedStreamIntoFullRows) {
  Pipeline p =
      base().pack({.length = 16, .field = "tokens", .separator = -7}).batch({.size = 3}).build();
  // The separator is negative: no separator.
  Loader l(p, {.epochs = 1});
  auto got = rows_of(l);
  auto want = stream(-1);
  want.resize(want.size() / 16 * 16);  // the partial last row is dropped
  EXPECT_EQ(got, want);
}

TEST_F(PackTest, AppendsTheSeparatorAndPadsTheLastRow) {
  Pipeline p = base()
                   .pack({.length = 10, .separator = 0, .drop_remainder = false, .pad = -1})
                   .batch({.size = 4})
                   .build();
  Loader l(p, {.epochs = 1});
  std::vector<Batch> batches;
  while (auto b = l.next()) batches.push_back(*b);
  std::vector<std::int32_t> got;
  for (const auto& b : batches) {
    EXPECT_EQ(b["tokens"].shape(), (Shape{static_cast<std::int64_t>(b.info.num_samples), 10}));
    for (auto x : b["tokens"].values<std::int32_t>()) got.push_back(x);
  }
  auto want = stream(0);
  while (want.size() % 10 != 0) want.push_back(-1);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(batches.back().info.is_last_in_epoch);
  EXPECT_EQ(batches.back().info.remainder, (want.size() / 10) % 4);
}

TEST_F(PackTest, RowsFollowMapsAfterPack) {
  Pipeline p = base()
                   .pack({.length = 8})
                   .map(
                       [](Sample& s, MapContext&) {
                         for (auto& x : s.at("tokens").values<std::int32_t>()) x = -x;
                       },
                       {.name = "negate"})
                   .batch({.size = 2})
                   .build();
  Loader l(p, {.epochs = 1});
  auto got = rows_of(l);
  auto want = stream(-1);
  want.resize(want.size() / 8 * 8);
  for (auto& x : want) x = -x;
  EXPECT_EQ(got, want);
}

TEST_F(PackTest, PassesTheSaveRestoreOracleWithShuffleAndWorkers) {
  auto make = [&] {
    return Pipeline::Builder()
        .seed(5)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .map(to_tokens, {.name = "tokens"})
        .pack({.length = 12, .separator = 9999})
        .batch({.size = 3})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 3, .workers = 1}, {.epochs = 3, .workers = 2});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 4}, {.epochs = 2, .workers = 1});
}

TEST_F(PackTest, StateHoldsTheCarryByReferenceNotTokens) {
  // A document longer than several rows: the state after each batch stays small.
  auto make = [&] {
    Pipeline::Builder b;
    b.seed(5)
        .records({.paths = {glob_}, .record_bytes = 16})
        .map(
            [](Sample& s, MapContext&) {
              Tensor t(DType::kInt64, Shape{5000});
              auto v = t.values<std::int64_t>();
              for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<std::int64_t>(j);
              s.set("tokens", t);
            },
            {.name = "long"});
    return b.pack({.length = 64}).batch({.size = 2}).build();
  };
  Loader l(make(), {.epochs = 1});
  std::size_t small = SIZE_MAX, large = 0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(l.next().has_value());
    small = std::min(small, l.state().size());
    large = std::max(large, l.state().size());
  }
  EXPECT_LT(large, 1024u) << "tokens would take 40 KB per document";
  EXPECT_LE(large - small, 16u);
  testing::expect_save_restore(make, {.epochs = 1, .workers = 2}, {.epochs = 1, .workers = 1});
}

TEST_F(PackTest, RejectsNonTokenFieldsWithTheRecord) {
  Pipeline p =
      Pipeline::Builder()
          .records({.paths = {glob_}, .record_bytes = 16})
          .map([](Sample& s, MapContext&) { s.set("tokens", Tensor(DType::kFloat32, Shape{3})); },
               {.name = "floats"})
          .pack({.length = 4})
          .batch({.size = 2})
          .build();
  Loader l(p, {.epochs = 1});
  try {
    l.next();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pack 'pack': field 'tokens' of record 0:0 is float32[3]; "
                                         "pack needs 1-D integer tokens"),
              std::string::npos)
        << e.what();
  }
  Pipeline missing = Pipeline::Builder()
                         .records({.paths = {glob_}, .record_bytes = 16})
                         .pack({.length = 4, .field = "ids"})
                         .batch({.size = 2})
                         .build();
  Loader m(missing, {.epochs = 1});
  try {
    m.next();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pack 'pack': record 0:0 has no field 'ids'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(PackTest, RefusesAnUpstreamThatCannotReadARecordTwice) {
  // Pack after pack: rows live only until their batch is assembled.
  Pipeline p = base().pack({.length = 8}).pack({.length = 4}).batch({.size = 2}).build();
  try {
    Loader l(p, {.epochs = 1});
    l.next();
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "pack#2");
    EXPECT_NE(std::string(e.what()).find("its upstream cannot read a record twice"),
              std::string::npos)
        << e.what();
  }
}

TEST(PackOptions, RejectsZeroLength) {
  try {
    Pipeline::Builder().pack({.length = 0});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pack.length: 0 is out of range (must be at least 1)"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace flowstate
