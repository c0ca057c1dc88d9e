// The batch node's collation of variable-size fields: padding and ragged, and user values; and
// its gather of fixed-size records, read ahead only where their bytes stay valid.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>

#include "flowstate/core/buffer.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::record_index;
using testing::TempDir;

/// Sample i gets "ids": int16 [i % 5] = i*10 + j, and "pair": float32 [i % 3, 2].
void variable(Sample& s, MapContext&) {
  const std::uint64_t i = record_index(static_cast<const std::byte*>(s.at("data").data()));
  Tensor ids(DType::kInt16, Shape{static_cast<std::int64_t>(i % 5)});
  auto v = ids.values<std::int16_t>();
  for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<std::int16_t>(i * 10 + j);
  Tensor pair(DType::kFloat32, Shape{static_cast<std::int64_t>(i % 3), 2});
  auto p = pair.values<float>();
  for (std::size_t j = 0; j < p.size(); ++j) p[j] = static_cast<float>(i) + 0.5f * j;
  s.set("ids", ids);
  s.set("pair", pair);
}

class CollateTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 20, 16, 1); }
  Batch first_batch(BatchOptions o) const {
    Pipeline p = Pipeline::Builder()
                     .records({.paths = {glob_}, .record_bytes = 16})
                     .map(variable, {.name = "variable"})
                     .batch(std::move(o))
                     .build();
    Loader l(p, {.epochs = 1});
    return *l.next();
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(CollateTest, PadsToTheLongestWithLengths) {
  Batch b = first_batch(
      {.size = 4, .collate = CollateMode::kPad, .fields = {"ids", "pair"}, .pad_value = -1});
  // Samples 0..3 have 0, 1, 2, 3 ids.
  EXPECT_EQ(b["ids"].shape(), (Shape{4, 3}));
  std::vector<std::int16_t> want{-1, -1, -1, 10, -1, -1, 20, 21, -1, 30, 31, 32};
  auto got = b["ids"].values<std::int16_t>();
  EXPECT_EQ(std::vector<std::int16_t>(got.begin(), got.end()), want);
  auto len = b["ids_length"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(len.begin(), len.end()),
            (std::vector<std::int64_t>{0, 1, 2, 3}));
  // "data" is not listed: it stacks.
  EXPECT_EQ(b["data"].shape(), (Shape{4, 16}));
  EXPECT_EQ(b.fields.find("data_length"), nullptr);
}

TEST_F(CollateTest, PadsMultiDimensionalRowsAlongTheFirstDimension) {
  Batch b = first_batch(
      {.size = 3, .collate = CollateMode::kPad, .fields = {"ids", "pair"}, .pad_value = 7});
  EXPECT_EQ(b["pair"].shape(), (Shape{3, 2, 2}));
  auto v = b["pair"].values<float>();
  // Sample 0: no rows (all padding); sample 1: one row {1, 1.5}; sample 2: {2, 2.5, 3, 3.5}.
  std::vector<float> want{7, 7, 7, 7, 1, 1.5, 7, 7, 2, 2.5, 3, 3.5};
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()), want);
}

TEST_F(CollateTest, RaggedConcatenatesWithOffsets) {
  Batch b = first_batch({.size = 5, .collate = CollateMode::kRagged, .fields = {"ids", "pair"}});
  EXPECT_EQ(b["ids"].shape(), (Shape{10}));
  auto off = b["ids_offsets"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(off.begin(), off.end()),
            (std::vector<std::int64_t>{0, 0, 1, 3, 6, 10}));
  auto ids = b["ids"].values<std::int16_t>();
  EXPECT_EQ(ids[0], 10);
  EXPECT_EQ(ids[9], 43);
  EXPECT_EQ(b["pair"].shape(), (Shape{0 + 1 + 2 + 0 + 1, 2}));
}

TEST_F(CollateTest, EmptyFieldListAppliesToEveryNonScalarField) {
  Batch b = first_batch({.size = 4, .collate = CollateMode::kRagged});
  EXPECT_NE(b.fields.find("data_offsets"), nullptr);
  EXPECT_NE(b.fields.find("ids_offsets"), nullptr);
  EXPECT_NE(b.fields.find("pair_offsets"), nullptr);
}

TEST_F(CollateTest, StackingVariableFieldsNamesTheFieldAndSamples) {
  try {
    first_batch({.size = 4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'ids' is int16[0] in sample 0 but int16[1] in "
                                         "sample 1 of step 0: stacking needs equal shapes"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CollateTest, PaddingNeedsEqualTrailingDimensions) {
  Pipeline p =
      Pipeline::Builder()
          .records({.paths = {glob_}, .record_bytes = 16})
          .map(
              [](Sample& s, MapContext&) {
                const auto i = record_index(static_cast<const std::byte*>(s.at("data").data()));
                s.set("m", Tensor(DType::kUInt8, Shape{2, static_cast<std::int64_t>(i + 1)}));
              },
              {.name = "m"})
          .batch({.size = 2, .collate = CollateMode::kPad, .fields = {"m"}})
          .build();
  Loader l(p, {.epochs = 1});
  try {
    l.next();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("field 'm' is uint8[2, 1] in sample 0 but uint8[2, 2] in "
                                   "sample 1 of step 0: padding and ragged collation need "
                                   "the same dtype and equal shapes after the first dimension"),
        std::string::npos)
        << e.what();
  }
}

TEST_F(CollateTest, ModeEntersTheFingerprintOnlyWhenNotStack) {
  auto fp = [&](BatchOptions o) {
    return Pipeline::Builder()
        .records({.paths = {glob_}, .record_bytes = 16})
        .batch(o)
        .build()
        .fingerprint();
  };
  EXPECT_NE(fp({.size = 4}), fp({.size = 4, .collate = CollateMode::kPad}));
  EXPECT_NE(fp({.size = 4, .collate = CollateMode::kPad, .pad_value = 0}),
            fp({.size = 4, .collate = CollateMode::kPad, .pad_value = 1}));
  EXPECT_EQ(batch_node().describe(BatchOptions{.size = 4}).to_string(),
            "batch(size=4, drop_last=false)");
}

TEST_F(CollateTest, PaddedBatchesResumeExactly) {
  auto make = [&] {
    return Pipeline::Builder()
        .seed(3)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .map(variable, {.name = "variable"})
        .batch(
            {.size = 3, .collate = CollateMode::kPad, .fields = {"ids", "pair"}, .pad_value = -2})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

// ---- BatchSlots: maps writing straight into the batch ----

/// Sample i's field "x" is float32 [2, 3] = i * 100 + j, written into output_tensor; with
/// `replace`, every third sample's is then replaced by a fresh copy (so no slot adoption).
SampleFn slot_writer(bool replace) {
  return [replace](Sample& s, MapContext& ctx) {
    const std::uint64_t i = record_index(static_cast<const std::byte*>(s.at("data").data()));
    Tensor x = output_tensor(ctx, field_id("x"), DType::kFloat32, Shape{2, 3});
    auto v = x.values<float>();
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(i * 100 + j);
    if (replace && i % 3 == 0) {
      Tensor copy(DType::kFloat32, Shape{2, 3});
      std::memcpy(copy.data(), x.data(), x.nbytes());
      x = copy;
    }
    s.set("x", x);
  };
}

TEST(BatchSlots, HandsEachSampleItsSlotOnceAndAdoptsTheBufferOnce) {
  auto pool = BufferPool::host();
  BatchSlots slots(*pool, 3);
  const FieldId x = field_id("x");
  std::vector<Sample> samples(3);
  for (std::size_t i = 0; i < 3; ++i)
    samples[i].set(x, slots.tensor(x, DType::kFloat32, Shape{2, 2}, i));
  EXPECT_EQ(pool->allocated(), 1u);
  const auto* base = static_cast<const std::byte*>(samples[0].at(x).data());
  EXPECT_EQ(samples[2].at(x).data(), base + 2 * 16);
  // A second request for a slot, another shape, an index past the batch: fresh tensors.
  EXPECT_NE(slots.tensor(x, DType::kFloat32, Shape{2, 2}, 1).data(), base + 16);
  EXPECT_NE(slots.tensor(x, DType::kFloat32, Shape{4}, 0).data(), base);
  EXPECT_FALSE(slots.tensor(x, DType::kFloat32, Shape{2, 2}, 3).data() == base + 3 * 16);
  Tensor batch = slots.adopt(x, samples);
  ASSERT_TRUE(batch.defined());
  EXPECT_EQ(batch.shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(batch.data(), base);
  EXPECT_FALSE(slots.adopt(x, samples).defined());  // once
  EXPECT_FALSE(slots.adopt(field_id("y"), samples).defined());
}

TEST(BatchSlots, AFieldNoLongerInItsSlotIsCopied) {
  auto pool = BufferPool::host();
  const FieldId x = field_id("x");
  for (int how = 0; how < 3; ++how) {
    BatchSlots slots(*pool, 2);
    std::vector<Sample> samples(2);
    for (std::size_t i = 0; i < 2; ++i)
      samples[i].set(x, slots.tensor(x, DType::kFloat32, Shape{4}, i));
    if (how == 0) samples[1].set(x, Tensor(DType::kFloat32, Shape{4}));  // replaced
    if (how == 1) samples[1].set(x, samples[0].at(x));                   // another's slot
    if (how == 2) samples.pop_back();                                    // fewer samples
    EXPECT_FALSE(slots.adopt(x, samples).defined()) << how;
  }
}

TEST_F(CollateTest, FieldsWrittenIntoTheirSlotsEqualCopiedOnes) {
  for (bool replace : {false, true}) {
    for (int collate = 0; collate < 2; ++collate) {
      BatchOptions o{.size = 8};
      // Pad collation of another field: no slots are offered, every field is copied.
      if (collate == 1) {
        o.collate = CollateMode::kPad;
        o.fields = {"data"};
      }
      Pipeline p = Pipeline::Builder()
                       .records({.paths = {glob_}, .record_bytes = 16})
                       .map(slot_writer(replace), {.name = "slots"})
                       .batch(std::move(o))
                       .build();
      Loader l(p, {.epochs = 1});
      std::size_t batches = 0;
      while (auto b = l.next()) {
        const Tensor& x = (*b)["x"];
        ASSERT_EQ(x.shape(), (Shape{static_cast<std::int64_t>(b->info.refs.size()), 2, 3}));
        for (std::size_t i = 0; i < b->info.refs.size(); ++i)
          for (std::size_t j = 0; j < 6; ++j)
            ASSERT_EQ(x.values<float>()[i * 6 + j],
                      static_cast<float>(b->info.refs[i].index * 100 + j));
        ++batches;
      }
      EXPECT_EQ(batches, 3u);
    }
  }
  auto make = [&] {
    return Pipeline::Builder()
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .map(slot_writer(true), {.name = "slots"})
        .batch({.size = 8})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

/// Fixed-size records whose bytes last until the calling thread's next record(), as a remote
/// source's blocks read through a small cache do: each call overwrites one buffer.
class OneSpanStore final : public RecordStore {
 public:
  explicit OneSpanStore(bool stable) : stable_(stable) {}
  std::size_t record_bytes() const override { return 16; }
  std::span<const std::byte> record(const Ref& ref) const override {
    ++reads_[ref.index];
    thread_local std::array<std::byte, 16> buffer;
    buffer.fill(static_cast<std::byte>(ref.index));
    return buffer;
  }
  void read(const Ref&, Sample&) const override { ADD_FAILURE() << "read() is not the gather"; }
  FieldId record_field() const override { return field_id("data"); }
  bool stable_records() const override { return stable_; }
  std::map<std::uint64_t, int>& reads() const { return reads_; }

 private:
  bool stable_;
  mutable std::map<std::uint64_t, int> reads_;
};

TEST(GatherTest, RecordsThatLastUntilTheNextReadAreEachReadOnceInOrder) {
  OneSpanStore store(/*stable=*/false);
  BatchAssembler assembler(&store, "remote", {.size = 8}, {}, {}, BufferPool::host());
  BatchPlan plan;
  for (std::uint64_t i : {5, 3, 9, 1, 7, 2, 8, 6}) plan.info.refs.push_back({0, 0, i});
  plan.info.num_samples = 8;
  const Batch b = assembler.assemble(std::move(plan));
  ASSERT_EQ(b["data"].shape(), (Shape{8, 16}));
  const auto* bytes = static_cast<const std::uint8_t*>(b["data"].data());
  const std::vector<std::uint8_t> order{5, 3, 9, 1, 7, 2, 8, 6};
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t j = 0; j < 16; ++j) ASSERT_EQ(bytes[r * 16 + j], order[r]) << r;
  // No read ahead: each record is read once, as a plan of the cache's reads counted it.
  for (const auto& [index, n] : store.reads()) EXPECT_EQ(n, 1) << "record " << index;
  EXPECT_EQ(store.reads().size(), 8u);
}

TEST(GatherTest, StableRecordsAreReadAheadAndGiveTheSameBatch) {
  OneSpanStore store(/*stable=*/true);  // (it lies: the look-ahead's reads are prefetches only)
  BatchAssembler assembler(&store, "local", {.size = 8}, {}, {}, BufferPool::host());
  BatchPlan plan;
  for (std::uint64_t i = 0; i < 8; ++i) plan.info.refs.push_back({0, 0, i});
  plan.info.num_samples = 8;
  const Batch b = assembler.assemble(std::move(plan));
  const auto* bytes = static_cast<const std::uint8_t*>(b["data"].data());
  for (std::size_t r = 0; r < 8; ++r) ASSERT_EQ(bytes[r * 16 + 15], r);
  EXPECT_EQ(store.reads().at(7), 2);  // ahead, then the copy
}

}  // namespace
}  // namespace flowstate
