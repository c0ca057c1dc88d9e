// `pack`: token sequences concatenated and cut into fixed rows; exact resume by reference.
#include "flowstate/nodes/pack.h"
#include "flowstate/nodes/builtin.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/sources/indexed.h"
#include "tests/support/formats.h"
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
  // The source's data identity (its file's name, sampled blocks and stat) plus a few counters.
  EXPECT_LT(large, 2048u) << "tokens would take 40 KB per document";
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

TEST_F(PackTest, DocIdsNumberTheDocumentsOfEachRow) {
  Pipeline p =
      base()
          .pack({.length = 10, .separator = 0, .drop_remainder = false, .pad = -1, .doc_ids = true})
          .batch({.size = 4})
          .build();
  Loader l(p, {.epochs = 1});
  // The stream with each token's document: a separator belongs to the document it closes.
  std::vector<std::int32_t> doc_of;
  for (std::uint64_t i = 0; i < 60; ++i)
    for (std::int32_t j = 0; j <= doc_len(i); ++j) doc_of.push_back(static_cast<std::int32_t>(i));
  std::vector<std::int32_t> want;
  for (std::size_t r = 0; r * 10 < doc_of.size(); ++r) {
    std::int32_t index = -1, last = -1;
    for (std::size_t k = r * 10; k < r * 10 + 10; ++k) {
      if (k >= doc_of.size()) {
        want.push_back(-1);
        continue;
      }
      if (doc_of[k] != last) ++index;
      last = doc_of[k];
      want.push_back(index);
    }
  }
  std::vector<std::int32_t> got;
  while (auto b = l.next()) {
    EXPECT_EQ(b->fields.at("tokens_doc_ids").dtype(), DType::kInt32);
    EXPECT_EQ(b->fields.at("tokens_doc_ids").shape(), b->fields.at("tokens").shape());
    for (auto x : (*b)["tokens_doc_ids"].values<std::int32_t>()) got.push_back(x);
  }
  EXPECT_EQ(got, want);
}

/// Writes PREFIX.idx / PREFIX.bin (Megatron's layout, one sequence per document) holding
/// `docs` of uint16 tokens.
void write_indexed(const std::string& prefix, const std::vector<std::vector<std::uint16_t>>& docs) {
  std::vector<std::int32_t> lengths;
  std::string bin;
  for (const auto& d : docs) {
    lengths.push_back(static_cast<std::int32_t>(d.size()));
    bin.append(reinterpret_cast<const char*>(d.data()), 2 * d.size());
  }
  testing::write_file(prefix + ".idx", megatron_index(DType::kUInt16, lengths));
  testing::write_file(prefix + ".bin", bin);
}

/// Pack over an `indexed` source: rows planned from the index alone (no map before pack).
TEST_F(PackTest, PullsDocumentsInChunksAndKeepsThePulledOnesInItsState) {
  // Documents of ~6 tokens, rows of 32: pack asks its upstream for the documents a pull's rows
  // likely take at once. The ones it has not started yet are in its state, so the oracle
  // (a save after every batch) restores states that hold some.
  auto make = [&] {
    return base().pack({.length = 32, .separator = 0}).batch({.size = 2}).build();
  };
  Loader l(make(), {.epochs = 2});
  drain(l);
  for (const auto& n : l.stats().nodes) {
    if (n.name != "records") continue;
    EXPECT_EQ(n.items, 120u);
    EXPECT_LT(n.calls * 3, n.items) << "one pull per document";
  }
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
}

/// `s` as version 2 writes it, without cereal's version number (load() is given one).
std::string saved(const PackState& s) {
  std::ostringstream os;
  {
    OutArchive ar(os);
    s.save(ar, 2);
  }
  return os.str();
}

TEST(PackStateVersions, KeepsOnlyThePendingDocumentsAndReadsVersion1WithNone) {
  PackState s{.epoch = 2,
              .rows = 9,
              .has_carry = true,
              .carry = Ref{0, 0, 5},
              .carry_at = 3,
              .documents = 11};
  s.pending = {Ref{0, 0, 6}, Ref{0, 0, 7}, Ref{0, 0, 8}};
  s.pending_at = 1;  // the first one was started
  {
    std::istringstream is(saved(s));
    InArchive ar(is);
    PackState back;
    back.load(ar, 2);
    EXPECT_EQ(back.pending, (std::vector<Ref>{Ref{0, 0, 7}, Ref{0, 0, 8}}));
    EXPECT_EQ(back.pending_at, 0u);
    EXPECT_EQ(back.documents, 11u);
    EXPECT_EQ(back.carry_at, 3u);
  }
  {
    std::ostringstream versioned;  // as a checkpoint holds it: with cereal's version number
    {
      OutArchive ar(versioned);
      ar(s);
    }
    std::istringstream is(versioned.str());
    InArchive ar(is);
    EXPECT_EQ(pack_node().inspect(ar, {}), R"({"epoch":2,"rows":9,"documents":11,"pending":2,)"
                                           R"("carry":{"record":"0:5","tokens_used":3}})");
  }
  // Version 1 had no pending documents.
  std::ostringstream old;
  {
    OutArchive ar(old);
    ar(s.epoch, s.rows, s.has_carry, s.carry, s.carry_at, s.documents);
  }
  std::istringstream is(old.str());
  InArchive ar(is);
  PackState v1;
  v1.pending = {Ref{}};
  v1.load(ar, 1);
  EXPECT_TRUE(v1.pending.empty());
  EXPECT_EQ(v1.rows, 9u);
}

TEST(PackStateVersions, RefusesMorePendingDocumentsThanPackEverPulls) {
  PackState s;
  s.pending.assign(kPackPull + 1, Ref{});
  std::istringstream is(saved(s));
  InArchive ar(is);
  PackState back;
  EXPECT_THROW(back.load(ar, 2), CheckpointError);
}

class PackIndexedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Document i: (i * 11) % 41 tokens (some empty, many longer than a row), token j = i * 64 + j.
    for (const char* name : {"a", "b"}) {
      std::vector<std::vector<std::uint16_t>> docs;
      for (std::uint16_t i = 0; i < 50; ++i) {
        std::vector<std::uint16_t> d((i * 11) % 41);
        for (std::size_t j = 0; j < d.size(); ++j)
          d[j] = static_cast<std::uint16_t>(i * 64 + j + (name[0] == 'b' ? 7 : 0));
        docs.push_back(std::move(d));
      }
      write_indexed(dir_ / name, docs);
    }
  }
  /// W2's shape in small: indexed → global shuffle → pack → batch, with `before` and `after`
  /// (identity maps, or none) around pack.
  Pipeline make(PackOptions pack, bool map_before = false, bool map_after = false,
                bool filter = false) const {
    Pipeline::Builder b = head(filter);
    if (map_before) b.map([](Sample&, MapContext&) {}, {.name = "identity"});
    b.pack(pack);
    if (map_after) b.map([](Sample&, MapContext&) {}, {.name = "identity_after"});
    return b.batch({.size = 3}).build();
  }
  /// The part before pack: the source, a global shuffle and, with `filter`, a filter that
  /// reads each document.
  Pipeline::Builder head(bool filter = false) const {
    Pipeline::Builder b;
    b.seed(3)
        .add(indexed_node(), IndexedOptions{.paths = {dir_ / "*.idx"}})
        .shuffle({.mode = ShuffleMode::kGlobal});
    if (filter)
      b.filter([](const Sample& s, MapContext&) { return s.at("tokens").numel() % 3 != 1; },
               {.name = "not_1_mod_3"});
    return b;
  }
  TempDir dir_;
};

std::vector<std::vector<std::byte>> field_bytes(Loader& l, const std::string& field) {
  std::vector<std::vector<std::byte>> out;
  while (auto b = l.next()) {
    const Tensor& t = b->fields.at(field);
    const auto* p = static_cast<const std::byte*>(t.data());
    out.emplace_back(p, p + t.nbytes());
  }
  return out;
}

TEST_F(PackIndexedTest, RowsPlannedFromTheIndexEqualRowsOfReadDocuments) {
  // The one-copy path (views planned in the spine, pieces gathered into the batch) against
  // documents read in the spine (a map before pack) and rows read one by one and stacked
  // (a map after pack): byte-identical tokens and document ids, with 1 and 2 workers.
  const PackOptions o{
      .length = 16, .separator = 0, .drop_remainder = false, .pad = 9, .doc_ids = true};
  for (const char* field : {"tokens", "tokens_doc_ids"}) {
    for (int workers : {1, 2}) {
      Loader direct(make(o), {.epochs = 2, .workers = workers});
      Loader read_before(make(o, true), {.epochs = 2, .workers = workers});
      Loader read_after(make(o, false, true), {.epochs = 2, .workers = workers});
      auto want = field_bytes(read_before, field);
      EXPECT_GT(want.size(), 20u);
      EXPECT_EQ(field_bytes(direct, field), want) << field << ", " << workers << " workers";
      EXPECT_EQ(field_bytes(read_after, field), want) << field << ", " << workers << " workers";
    }
  }
  // The rows keep the data set's dtype.
  Loader l(make(o), {.epochs = 1});
  EXPECT_EQ(l.next()->fields.at("tokens").dtype(), DType::kUInt16);
}

TEST_F(PackIndexedTest, PassesTheSaveRestoreOracleInsideRowsAndAcrossEpochs) {
  // Documents of up to 40 tokens cut into rows of 16: nearly every breakpoint is inside a
  // document that a row began, and the epoch end pads its last row.
  auto padded = [&] {
    return make({.length = 16, .separator = 0, .drop_remainder = false, .doc_ids = true});
  };
  testing::expect_save_restore(padded, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  testing::expect_save_restore(padded, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
  auto dropped = [&] { return make({.length = 16, .separator = 0}); };
  testing::expect_save_restore(dropped, {.epochs = 3, .workers = 2}, {.epochs = 3, .workers = 1});
  auto filtered = [&] { return make({.length = 16, .separator = 0}, false, false, true); };
  testing::expect_save_restore(filtered, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

TEST_F(PackIndexedTest, ResumesInTheMiddleOfADocument) {
  const PackOptions o{.length = 16, .separator = 0, .doc_ids = true};
  Loader whole(make(o), {.epochs = 2, .workers = 2});
  auto want = field_bytes(whole, "tokens");
  for (std::size_t k : {std::size_t{1}, std::size_t{5}, want.size() / 2, want.size() / 2 + 1}) {
    Loader first(make(o), {.epochs = 2, .workers = 1});
    std::vector<std::vector<std::byte>> got;
    for (std::size_t i = 0; i < k; ++i) {
      auto b = first.next();
      ASSERT_TRUE(b.has_value());
      const auto* p = static_cast<const std::byte*>(b->fields.at("tokens").data());
      got.emplace_back(p, p + b->fields.at("tokens").nbytes());
    }
    const std::string state = first.state();
    Loader again(make(o), {.epochs = 2, .workers = 2});
    again.load_state(state);
    for (auto& b : field_bytes(again, "tokens")) got.push_back(std::move(b));
    EXPECT_EQ(got, want) << "resumed after " << k << " batches";
  }
}

/// Documents that must be read (a map before pack) are read ahead of the spine in parallel;
/// the rows, the states and the errors are those of reading them one by one.
class PackReadAheadTest : public PackIndexedTest {
 protected:
  static PackOptions with(std::uint64_t read_ahead) {
    return {.length = 16,
            .separator = 0,
            .drop_remainder = false,
            .doc_ids = true,
            .read_ahead = read_ahead};
  }
};

TEST_F(PackReadAheadTest, RowsEqualRowsReadOneByOne) {
  // Windows of 2, 5 and 256 documents (the first ones of 16, then doubling) against none,
  // with and without a filter (that reads) in front of pack.
  for (bool filter : {false, true}) {
    for (int workers : {1, 2}) {
      Loader one_by_one(make(with(0), true, false, filter), {.epochs = 2, .workers = workers});
      const auto want = field_bytes(one_by_one, "tokens");
      ASSERT_GT(want.size(), 20u);
      for (std::uint64_t window : {2, 5, 256}) {
        Loader ahead(make(with(window), true, false, filter), {.epochs = 2, .workers = workers});
        EXPECT_EQ(field_bytes(ahead, "tokens"), want)
            << window << ", " << workers << " workers, filter " << filter;
      }
    }
  }
}

TEST_F(PackReadAheadTest, PassesTheSaveRestoreOracleInsideRowsAndAcrossEpochs) {
  // Windows that end inside rows and across the epoch's end; restored with other workers.
  for (std::uint64_t window : {3, 256}) {
    auto make_it = [&] { return make(with(window), true); };
    testing::expect_save_restore(make_it, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
    testing::expect_save_restore(make_it, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
  }
  // A filter before the map: pack's upstream is not indexed; the filter decides ahead and
  // tells pack which documents it will pass on.
  for (std::uint64_t window : {3, 256}) {
    auto filtered = [&] { return make(with(window), true, false, true); };
    testing::expect_save_restore(filtered, {.epochs = 2, .workers = 2},
                                 {.epochs = 2, .workers = 1});
  }
}

TEST_F(PackReadAheadTest, ReadsInParallel) {
  // The map before pack (a tokenizer's place) runs on more than one thread at once with a
  // window, also behind a filter, and never without one (the serial spine reads); with or
  // without, each document is read once (a window that pack had to give up would be read
  // again one by one).
  struct Reads {
    int most = 0;
    int calls = 0;
  };
  auto reads = [&](std::uint64_t window, bool filter = false) {
    testing::ConcurrencyProbe probe(window > 0);
    std::atomic<int> calls{0};
    Pipeline::Builder b = head(filter);
    b.map(
         [&](Sample&, MapContext&) {
           ++calls;
           probe.call(std::chrono::microseconds(500));
         },
         {.name = "slow_tokenizer"})
        .pack(with(window))
        .batch({.size = 3});
    Loader l(b.build(), {.epochs = 1, .workers = 2});
    while (l.next()) {
    }
    return Reads{probe.most(), calls.load()};
  };
  for (bool filter : {false, true}) {
    const Reads one_by_one = reads(0, filter), ahead = reads(64, filter);
    EXPECT_EQ(one_by_one.most, 1) << filter;
    EXPECT_GE(ahead.most, 2) << filter;
    EXPECT_EQ(ahead.calls, one_by_one.calls) << filter;
  }
}

TEST_F(PackReadAheadTest, AReadErrorStopsAtTheSameBatchAsWithoutAWindow) {
  // Document 37 cannot be read: with and without a window the same batches come first and the
  // same error follows; the documents read ahead after it change nothing.
  auto run = [&](std::uint64_t window) {
    Pipeline::Builder b = head();
    b.map(
         [](Sample& s, MapContext&) {
           if (s.ref.index == 37) throw DataError("doc37.txt", 12, "cannot tokenize");
         },
         {.name = "tokenizer"})
        .pack(with(window))
        .batch({.size = 1});
    Loader l(b.build(), {.epochs = 1, .workers = 2});
    std::vector<std::vector<std::byte>> got;
    try {
      while (auto batch = l.next()) {
        const auto* p = static_cast<const std::byte*>(batch->fields.at("tokens").data());
        got.emplace_back(p, p + batch->fields.at("tokens").nbytes());
      }
    } catch (const DataError& e) {
      return std::pair{got, e.file() + "@" + std::to_string(e.offset()) + ": " + e.what()};
    }
    return std::pair{got, std::string("no error")};
  };
  const auto want = run(0);
  EXPECT_NE(want.second.find("cannot tokenize"), std::string::npos) << want.second;
  EXPECT_EQ(want.second.rfind("doc37.txt@12: ", 0), 0u) << want.second;
  EXPECT_FALSE(want.first.empty());
  for (std::uint64_t window : {4, 256}) {
    const auto got = run(window);
    EXPECT_EQ(got.first, want.first) << window;
    EXPECT_EQ(got.second, want.second) << window;
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
