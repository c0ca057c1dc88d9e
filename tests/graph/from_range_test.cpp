// from_range / from_producer: user types as sources (DESIGN.md §9). Every kind of source runs
// the save/restore oracle with its values exposed to the batch digest, and the unknown-length
// sources are checked for exact BatchInfo.
// Over 600 lines: every kind of user source (index, save_load, replay, producer, unknown
// length) with its oracle run, and the Collate and stream-shuffle cases they share.
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/iterable.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <list>
#include <ranges>
#include <string>
#include <vector>

#include "flowstate/config/inspect.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/loader_runtime_parts.h"
#include "tests/support/testing.h"

// Test types live in a named namespace so their names in messages are stable.
namespace flowstate::fr_test {

struct Doc {
  std::string text;
  int label = 0;
};

struct Point {
  float x = 0, y = 0;
};

/// A value whose ToDevice specialization marks it, to see device_copy call it.
struct Marked {
  int value = 0;
  bool moved = false;
};

/// A forward-only iterable of the integers [0, n), with its own iterator type.
class Countdown {
 public:
  explicit Countdown(int n) : n_(n) {}
  class iterator {
   public:
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(int i) : i_(i) {}
    int operator*() const { return i_; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    iterator operator++(int) {
      iterator t = *this;
      ++i_;
      return t;
    }
    bool operator==(const iterator&) const = default;

   private:
    int i_ = 0;
  };
  iterator begin() const { return iterator(0); }
  iterator end() const { return iterator(n_); }

 private:
  int n_;
};

/// Counts every next() of the producers below, to tell a replay from a load.
std::atomic<std::uint64_t> g_next_calls{0};
/// The index of the first value produced since it was last reset to kNoIndex.
constexpr std::uint64_t kNoIndex = ~std::uint64_t{0};
std::atomic<std::uint64_t> g_first_index{kNoIndex};

/// Yields "e<epoch>-<i>" for i in [0, n); resumes through save/load.
struct Names {
  std::uint64_t epoch = 0;
  std::uint64_t i = 0;
  std::uint64_t n = 0;
  std::optional<std::string> next() {
    ++g_next_calls;
    if (i == n) return std::nullopt;
    std::uint64_t none = kNoIndex;
    g_first_index.compare_exchange_strong(none, i);
    return "e" + std::to_string(epoch) + "-" + std::to_string(i++);
  }
  std::string save() const { return std::to_string(i); }
  void load(std::string_view s) { i = std::stoull(std::string(s)); }
};

/// The same without save/load: resumes by replaying.
struct PlainNames {
  Names inner;
  std::optional<std::string> next() { return inner.next(); }
};

static_assert(ResumableProducer<Names>);
static_assert(ValueProducer<PlainNames> && !ResumableProducer<PlainNames>);

}  // namespace flowstate::fr_test

template <>
struct flowstate::Collate<flowstate::fr_test::Point> {
  using type = Tensor;
  static Tensor collate(std::vector<fr_test::Point>&& points) {
    Tensor t(DType::kFloat32, Shape{static_cast<std::int64_t>(points.size()), 2});
    auto v = t.values<float>();
    for (std::size_t i = 0; i < points.size(); ++i) {
      v[2 * i] = points[i].x;
      v[2 * i + 1] = points[i].y;
    }
    return t;
  }
};

template <>
struct flowstate::ToDevice<std::vector<flowstate::fr_test::Marked>> {
  static void to_device(std::vector<fr_test::Marked>& values, DeviceCopy&) {
    for (auto& m : values) m.moved = true;
  }
};

namespace flowstate {
namespace {

using fr_test::Countdown;
using fr_test::Doc;
using fr_test::Marked;
using fr_test::Names;
using fr_test::PlainNames;
using fr_test::Point;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

/// A batch map that copies the collated user value into field "value", so Batch::digest
/// (and with it the oracle) covers the user values.
template <class T>
BatchFn expose(std::function<std::string(const T&)> encode) {
  return [encode](Batch& b, MapContext&) {
    std::string bytes;
    for (const T& v : batch_value<T>(b)) bytes += encode(v) + '\n';
    Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(bytes.size())});
    if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    b.fields.set("value", t);
  };
}

/// The same for values collated into a Tensor.
template <class T>
BatchFn expose_tensor() {
  return [](Batch& b, MapContext&) { b.fields.set("value", batch_value<T>(b)); };
}

std::vector<std::int64_t> int64s(const Tensor& t) {
  auto v = t.values<std::int64_t>();
  return {v.begin(), v.end()};
}

std::vector<std::string> strings_of(const Batch& b) { return batch_value<std::string>(b); }

void check_oracle(const std::function<Pipeline()>& make) {
  for (int workers : {2, 4}) {
    SCOPED_TRACE("restored with " + std::to_string(workers) + " workers");
    testing::expect_save_restore(make, {.epochs = 2, .workers = 1},
                                 {.epochs = 2, .workers = workers});
  }
}

std::vector<Doc> make_docs(int n) {
  std::vector<Doc> docs;
  for (int i = 0; i < n; ++i) docs.push_back({"doc" + std::to_string(i), i % 3});
  return docs;
}

std::string encode_doc(const Doc& d) { return d.text + "/" + std::to_string(d.label); }

// ---- the three kinds, through the oracle ----

TEST(FromRange, RandomAccessVectorResumesByIndex) {
  const std::vector<Doc> docs = make_docs(50);
  auto make = [&] {
    return Pipeline::Builder()
        .seed(11)
        .source(from_range(docs, {.name = "docs"}))
        .shuffle({})
        .map(map_value<Doc>([](Doc& d, MapContext& ctx) {
               d.text += "+" + std::to_string(ctx.rng.below(100));
             }),
             {.name = "tag"})
        .batch({.size = 8})
        .map_batch(expose<Doc>(encode_doc), {.name = "expose"})
        .build();
  };
  Pipeline p = make();
  EXPECT_TRUE(p.warnings().empty());
  check_oracle(make);
}

TEST(FromRange, ARestoreOnARangeOfAnotherSizeIsRefused) {
  // A known size is part of the source's description, so the fingerprint refuses a state
  // saved over a range of another size, naming both sizes.
  auto make = [](std::size_t n) {
    std::vector<std::int64_t> values(n);
    return Pipeline::Builder()
        .source(from_range(std::move(values), {.name = "ints"}))
        .batch({.size = 10})
        .build();
  };
  Loader l(make(1000));
  ASSERT_TRUE(l.next());
  const std::string state = l.state();
  Loader other(make(900));
  try {
    other.load_state(state);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()),
              "the state was saved by a pipeline whose output differs:\n"
              "iterable.size: 1000 in checkpoint, 900 now");
  }
}

TEST(FromRange, RandomAccessSourceIsIndexedWithItsSize) {
  std::vector<int> values(20, 1);
  SourceSpec spec = from_range(values, {.name = "ints"});
  EXPECT_EQ(spec.description.to_string(), "iterable(name=ints, resume=index, size=20)");
  SourceParts parts = spec.factory("iterable", 3);
  EXPECT_TRUE(parts.node->indexed());
  EXPECT_EQ(parts.node->size(0), 20u);
  EXPECT_EQ(parts.node->at(5, 7), (Ref{3, 0, 7}));
  EXPECT_EQ(parts.store->record_bytes(), 0u);
}

TEST(FromRange, ResumableProducerResumesThroughSaveLoad) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Names{e, 0, 37};
            },
            {.name = "names"}))
        .map(map_value<std::string>([](std::string& s) { s += "!"; }), {.name = "bang"})
        .batch({.size = 8})
        .map_batch(expose<std::string>([](const std::string& s) { return s; }), {.name = "expose"})
        .build();
  };
  EXPECT_TRUE(make().warnings().empty());
  check_oracle(make);
}

TEST(FromRange, ResumableProducerDoesNotReplay) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Names{e, 0, 1000};
            },
            {.name = "names"}))
        .batch({.size = 10})
        .build();
  };
  std::string state;
  {
    Loader l(make());
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(l.next());
    state = l.state();
  }
  Loader resumed(make(), {.workers = 1, .prefetch = 1});
  fr_test::g_next_calls = 0;
  fr_test::g_first_index = fr_test::kNoIndex;
  resumed.load_state(state);
  auto b = resumed.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(strings_of(*b).front(), "e0-500");
  // The producer went on from 500: the 500 values consumed were never produced again.
  EXPECT_EQ(fr_test::g_first_index.load(), 500u);
  // What it produced: the batch, the look-ahead and what the graph prepares ahead (the two
  // messages in flight and one the input node holds, each of at most kGroupMax cheap batches,
  // graph/loader_runtime_parts.h).
  EXPECT_LE(fr_test::g_next_calls.load(), 10u + 3 * loader_detail::kGroupMax * 10);
}

TEST(FromRange, TwoRestoresBeforeTheFirstBatchLeaveTheLastOnesPosition) {
  // The first restore of a new Loader happens in place (nothing planned yet); a second one
  // must not start from the first's position — a replaying producer would skip twice.
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return PlainNames{{e, 0, 100}};
            },
            {.name = "names"}))
        .batch({.size = 10})
        .build();
  };
  auto state_at = [&](int step) {
    Loader l(make());
    for (int i = 0; i < step; ++i) EXPECT_TRUE(l.next());
    return l.state();
  };
  const std::string at3 = state_at(3), at6 = state_at(6);
  Loader l(make());
  l.load_state(at3);
  l.load_state(at6);
  auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(strings_of(*b).front(), "e0-60");
  Loader once(make());
  once.load_state(at3);
  b = once.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(strings_of(*b).front(), "e0-30");
}

// A buffer shuffle of a forward-only source (StreamShuffleNode): every breakpoint of the
// oracle, with buffers smaller and larger than a batch, over a producer that resumes through
// save/load and one that replays.
TEST(StreamShuffle, ResumableProducerPassesTheOracle) {
  for (std::uint64_t size : {3u, 16u, 50u}) {
    SCOPED_TRACE("buffer " + std::to_string(size));
    auto make = [size] {
      return Pipeline::Builder()
          .seed(5)
          .source(from_producer(
              [](std::uint64_t e) {
                return Names{e, 0, 203};
              },
              {.name = "names"}))
          .shuffle({.mode = ShuffleMode::kBuffer, .size = size})
          .batch({.size = 8})
          .map_batch(expose<std::string>([](const std::string& s) { return s; }),
                     {.name = "expose"})
          .build();
    };
    check_oracle(make);
  }
}

TEST(StreamShuffle, ReplayingProducerPassesTheOracle) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return PlainNames{{e, 0, 77}};
            },
            {.name = "plain"}))
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 10})
        .batch({.size = 4})
        .map_batch(expose<std::string>([](const std::string& s) { return s; }), {.name = "expose"})
        .build();
  };
  check_oracle(make);
}

TEST(StreamShuffle, ShufflesEveryItemOncePerEpochDifferentlyEachEpoch) {
  Loader l(Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 100};
                   },
                   {.name = "names"}))
               .shuffle({.mode = ShuffleMode::kBuffer, .size = 20})
               .batch({.size = 10})
               .build(),
           {.epochs = 2});
  std::vector<std::string> e0, e1;
  while (auto b = l.next())
    for (const auto& s : strings_of(*b)) (b->info.epoch == 0 ? e0 : e1).push_back(s.substr(3));
  ASSERT_EQ(e0.size(), 100u);
  ASSERT_EQ(e1.size(), 100u);
  EXPECT_NE(e0, e1);
  std::vector<std::string> in_order;
  for (int i = 0; i < 100; ++i) in_order.push_back(std::to_string(i));
  EXPECT_NE(e0, in_order);
  std::sort(e0.begin(), e0.end());
  std::sort(in_order.begin(), in_order.end());
  EXPECT_EQ(e0, in_order);
}

TEST(StreamShuffle, RestoreReproducesAFewBuffersNotTheEpochPrefix) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Names{e, 0, 100000};
            },
            {.name = "names"}))
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
        .batch({.size = 10})
        .build();
  };
  std::string state;
  std::vector<std::string> expected;
  {
    Loader l(make());
    for (int i = 0; i < 5000; ++i) ASSERT_TRUE(l.next());
    state = l.state();
    expected = strings_of(*l.next());
  }
  EXPECT_LT(state.size(), 1500u);  // the key-frame's 100 slots and the producer's position
  Loader resumed(make(), {.workers = 1, .prefetch = 1});
  fr_test::g_next_calls = 0;
  resumed.load_state(state);
  auto b = resumed.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(strings_of(*b), expected);
  // At most about four buffers re-produced, plus what the graph prepares ahead (three
  // messages of at most kGroupMax cheap batches of 10), never the 50 000 items consumed.
  EXPECT_LT(fr_test::g_next_calls.load(), 400u + 3 * loader_detail::kGroupMax * 10 + 100);
}

TEST(StreamShuffle, InspectReadsItsState) {
  Loader l(Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 1000};
                   },
                   {.name = "names"}))
               .shuffle({.mode = ShuffleMode::kBuffer, .size = 10})
               .batch({.size = 4})
               .build());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(l.next());
  const PipelineState s = PipelineState::decode(l.state());
  const std::string nodes = describe_node_states(s.spine, s.canonical, "state");
  // 80 draws; the buffer is topped up to 10 before each draw, so 89 inputs went in.
  EXPECT_THAT(nodes, ::testing::HasSubstr(R"("type":"shuffle","state":{"epoch":0,"draws":80,)"
                                          R"("consumed":89,)"));
  EXPECT_THAT(nodes, ::testing::HasSubstr(R"("keyframe":{"draws":80,"consumed":89,)"));
  EXPECT_THAT(nodes, ::testing::HasSubstr(R"("slots":9,"source_state_bytes":)"));
}

TEST(FromRange, ForwardListReplaysFromTheEpochStart) {
  const std::list<int> values = [] {
    std::list<int> l;
    for (int i = 0; i < 45; ++i) l.push_back(i * 7);
    return l;
  }();
  auto make = [&] {
    return Pipeline::Builder()
        .source(from_range(values, {.name = "list"}))
        .map(map_value<int>([](int& v) { v += 1; }), {.name = "inc"})
        .batch({.size = 8})
        .map_batch(expose_tensor<int>(), {.name = "expose"})
        .build();
  };
  // A std::list is sized: its length is known, and only the resume replays.
  EXPECT_EQ(make().nodes().front().description.to_string(),
            "iterable(name=list, resume=replay, size=45)");
  check_oracle(make);
}

TEST(FromRange, FilteredViewOfUnknownLengthReplaysFromTheEpochStart) {
  auto make = [] {
    auto odds = std::views::iota(0, 75) | std::views::filter([](int i) { return i % 2 == 1; });
    return Pipeline::Builder()
        .source(from_range(odds, {.name = "odds"}))
        .batch({.size = 5})
        .map_batch(expose_tensor<int>(), {.name = "expose"})
        .build();
  };
  EXPECT_EQ(make().nodes().front().description.to_string(), "iterable(name=odds, resume=replay)");
  check_oracle(make);
}

TEST(FromRange, UsersOwnForwardIterableReplays) {
  const Countdown numbers(30);
  auto make = [&] {
    return Pipeline::Builder()
        .source(from_range(numbers, {.name = "countdown"}))
        .map(map_value<int, std::string>([](int& v) { return std::to_string(v * v); }),
             {.name = "square"})
        .batch({.size = 4, .user_collate = collate_user<std::string>()})
        .map_batch(expose<std::string>([](const std::string& s) { return s; }), {.name = "expose"})
        .build();
  };
  check_oracle(make);
  Loader l(make());
  auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_THAT(strings_of(*b), ElementsAre("0", "1", "4", "9"));
}

TEST(FromRange, ProducerWithoutSaveLoadReplays) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return PlainNames{{e, 0, 29}};
            },
            {.name = "plain"}))
        .batch({.size = 6})
        .map_batch(expose<std::string>([](const std::string& s) { return s; }), {.name = "expose"})
        .build();
  };
  check_oracle(make);
}

TEST(FromRange, EndlessRangeIsCutAtTheGivenSize) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_range(std::views::iota(std::int64_t{0}), {.name = "naturals", .size = 10}))
        .batch({.size = 4})
        .map_batch(expose_tensor<std::int64_t>(), {.name = "expose"})
        .build();
  };
  auto all = [&] {
    Loader l(make(), {.epochs = 2});
    std::vector<std::vector<std::int64_t>> out;
    while (auto b = l.next()) out.push_back(int64s(batch_value<std::int64_t>(*b)));
    return out;
  }();
  EXPECT_THAT(all,
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7), ElementsAre(8, 9),
                          ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7), ElementsAre(8, 9)));
  check_oracle(make);
}

TEST(FromRange, ReplayingSourcesWarnWhenThePipelineIsBuilt) {
  std::list<int> values{1, 2, 3};
  Pipeline a = Pipeline::Builder()
                   .source(from_range(values, {.name = "numbers"}))
                   .batch({.size = 2})
                   .build();
  EXPECT_THAT(a.warnings(),
              ElementsAre("iterable: 'numbers' is a forward-only range without save/load: a "
                          "resume replays up to one epoch from its start"));
  Pipeline b = Pipeline::Builder()
                   .source(from_producer(
                       [](std::uint64_t e) {
                         return PlainNames{{e, 0, 3}};
                       },
                       {.name = "gen"}))
                   .batch({.size = 2})
                   .build();
  EXPECT_THAT(b.warnings(), ElementsAre("iterable: 'gen' is a producer without save/load: a "
                                        "resume replays up to one epoch from its start"));
}

TEST(FromRange, RvalueRangeIsOwnedByThePipeline) {
  Pipeline p = [] {
    std::vector<std::string> words{"a", "b", "c", "d", "e"};
    return Pipeline::Builder()
        .source(from_range(std::move(words), {.name = "words"}))
        .batch({.size = 2})
        .build();
  }();
  Loader l(p);
  std::vector<std::string> all;
  for (const Batch& b : l)
    for (const auto& s : strings_of(b)) all.push_back(s);
  EXPECT_THAT(all, ElementsAre("a", "b", "c", "d", "e"));
}

// ---- filters ----

TEST(FromRange, FilterValueKeepsCheckpointsExact) {
  const std::vector<Doc> docs = make_docs(60);
  auto make = [&] {
    return Pipeline::Builder()
        .source(from_range(docs, {.name = "docs"}))
        .filter(filter_value<Doc>([](const Doc& d) { return d.label != 1; }), {.name = "no1"})
        .batch({.size = 7})
        .map_batch(expose<Doc>(encode_doc), {.name = "expose"})
        .build();
  };
  check_oracle(make);
  Loader l(make());
  std::size_t kept = 0;
  for (const Batch& b : l)
    for (const Doc& d : batch_value<Doc>(b)) {
      EXPECT_NE(d.label, 1);
      ++kept;
    }
  EXPECT_EQ(kept, 40u);
}

TEST(FromRange, FilterValueOnAProducerKeepsCheckpointsExact) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Names{e, 0, 53};
            },
            {.name = "names"}))
        .filter(filter_value<std::string>(
                    [](const std::string&, MapContext& ctx) { return ctx.rng.below(3) != 0; }),
                {.name = "random"})
        .batch({.size = 4})
        .map_batch(expose<std::string>([](const std::string& s) { return s; }), {.name = "expose"})
        .build();
  };
  check_oracle(make);
}

// ---- BatchInfo of unknown-length sources ----

std::vector<Batch> all_batches(const Pipeline& p, std::uint64_t epochs = 2) {
  Loader l(p, {.epochs = epochs});
  std::vector<Batch> out;
  while (auto b = l.next()) out.push_back(std::move(*b));
  return out;
}

TEST(FromRange, UnknownLengthSourceMarksTheLastBatchAndItsRemainder) {
  auto p = Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 37};
                   },
                   {.name = "names"}))
               .batch({.size = 8})
               .build();
  EXPECT_EQ(p.nodes().front().description.to_string(), "iterable(name=names, resume=save_load)");
  auto all = all_batches(p);
  ASSERT_EQ(all.size(), 10u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const BatchInfo& info = all[i].info;
    SCOPED_TRACE("batch " + std::to_string(i));
    EXPECT_EQ(info.step, i);
    EXPECT_EQ(info.epoch, i / 5);
    EXPECT_EQ(info.index_in_epoch, i % 5);
    const bool last = i % 5 == 4;
    EXPECT_EQ(info.is_last_in_epoch, last);
    EXPECT_EQ(info.num_samples, last ? 5u : 8u);
    EXPECT_EQ(info.remainder, last ? 5u : 0u);
    if (last) {
      EXPECT_EQ(info.batches_in_epoch, std::optional<std::uint64_t>(5));
    } else {
      EXPECT_EQ(info.batches_in_epoch, std::nullopt);
    }
  }
  EXPECT_THAT(strings_of(all[9]), ElementsAre("e1-32", "e1-33", "e1-34", "e1-35", "e1-36"));
}

TEST(FromRange, UnknownLengthSourceOfWholeBatchesEndsWithAFullLastBatch) {
  auto p = Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 32};
                   },
                   {.name = "names"}))
               .batch({.size = 8})
               .build();
  auto all = all_batches(p);
  ASSERT_EQ(all.size(), 8u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].info.is_last_in_epoch, i % 4 == 3) << i;
    EXPECT_EQ(all[i].info.remainder, 0u) << i;
    EXPECT_EQ(all[i].info.num_samples, 8u) << i;
  }
}

TEST(FromRange, UnknownLengthSourceWithDropLastEndsWithTheLastFullBatch) {
  auto p = Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 37};
                   },
                   {.name = "names"}))
               .batch({.size = 8, .drop_last = true})
               .build();
  auto all = all_batches(p);
  ASSERT_EQ(all.size(), 8u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].info.is_last_in_epoch, i % 4 == 3) << i;
    EXPECT_EQ(all[i].info.remainder, 0u) << i;
  }
}

TEST(FromRange, ProducerOfKnownSizeIsPlannedLikeASizedSource) {
  auto p = Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 37};
                   },
                   {.name = "names", .size = 37}))
               .batch({.size = 8})
               .build();
  EXPECT_EQ(p.nodes().front().description.to_string(),
            "iterable(name=names, resume=save_load, size=37)");
  auto all = all_batches(p, 1);
  ASSERT_EQ(all.size(), 5u);
  for (const Batch& b : all) EXPECT_EQ(b.info.batches_in_epoch, std::optional<std::uint64_t>(5));
  EXPECT_TRUE(all[4].info.is_last_in_epoch);
  EXPECT_EQ(all[4].info.remainder, 5u);
}

TEST(FromRange, ProducerEndingBeforeItsSizeIsADataError) {
  auto p = Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t e) {
                     return Names{e, 0, 10};
                   },
                   {.name = "short", .size = 12}))
               .batch({.size = 4})
               .build();
  Loader l(p);
  try {
    while (l.next()) {
    }
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "node 'iterable': 'short' ended after 10 elements of epoch 0, but its size is 12");
  }
}

// ---- collation ----

template <class T>
Tensor collate_of(std::vector<T> v) {
  return Collate<T>::collate(std::move(v));
}

TEST(Collate, ArithmeticValuesStackIntoATensorOfTheirDType) {
  Tensor i = collate_of<int>({1, -2, 3});
  EXPECT_EQ(i.dtype(), DType::kInt32);
  EXPECT_EQ(i.shape(), (Shape{3}));
  EXPECT_THAT(std::vector<int>(i.values<int>().begin(), i.values<int>().end()),
              ElementsAre(1, -2, 3));
  EXPECT_EQ(collate_of<double>({0.5}).dtype(), DType::kFloat64);
  EXPECT_EQ(collate_of<float>({0.5f}).dtype(), DType::kFloat32);
  EXPECT_EQ(collate_of<long long>({1}).dtype(), DType::kInt64);
  EXPECT_EQ(collate_of<unsigned char>({1}).dtype(), DType::kUInt8);
  EXPECT_EQ(collate_of<std::uint16_t>({1}).dtype(), DType::kUInt16);
  Tensor b = collate_of<bool>({true, false, true});
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_THAT(std::vector<bool>(b.values<bool>().begin(), b.values<bool>().end()),
              ElementsAre(true, false, true));
}

TEST(Collate, FixedSizeArraysStackIntoAMatrix) {
  Tensor t = collate_of<std::array<float, 3>>({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_THAT(std::vector<float>(t.values<float>().begin(), t.values<float>().end()),
              ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(Collate, TensorsStackAndMismatchesAreDataErrors) {
  Tensor a(DType::kInt64, Shape{2});
  a.values<std::int64_t>()[0] = 1;
  a.values<std::int64_t>()[1] = 2;
  Tensor b = a.clone();
  b.values<std::int64_t>()[0] = 3;
  Tensor t = Collate<Tensor>::collate({a, b});
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  EXPECT_THAT(int64s(t), ElementsAre(1, 2, 3, 2));
  try {
    Collate<Tensor>::collate({a, Tensor(DType::kInt64, Shape{3})});
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Collate<Tensor>: value 1 is int64[3], value 0 is int64[2]: stacking needs equal "
              "dtypes and shapes");
  }
}

TEST(Collate, OtherTypesStayAListByDefault) {
  static_assert(std::is_same_v<Collate<std::string>::type, std::vector<std::string>>);
  static_assert(std::is_same_v<Collate<Doc>::type, std::vector<Doc>>);
  static_assert(std::is_same_v<Collate<long double>::type, std::vector<long double>>);
  static_assert(std::is_same_v<Collate<char32_t>::type, std::vector<char32_t>>);
  std::vector<std::string> in{"x", "y"};
  EXPECT_THAT(Collate<std::string>::collate(std::move(in)), ElementsAre("x", "y"));
}

TEST(Collate, AUserSpecializationCollatesThePipelinesBatches) {
  std::vector<Point> points;
  for (int i = 0; i < 10; ++i) points.push_back({static_cast<float>(i), static_cast<float>(-i)});
  Loader l(Pipeline::Builder()
               .source(from_range(points, {.name = "points"}))
               .batch({.size = 4})
               .build());
  std::vector<Batch> all;
  while (auto b = l.next()) all.push_back(std::move(*b));
  ASSERT_EQ(all.size(), 3u);
  const Tensor& t = batch_value<Point>(all[2]);
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  EXPECT_THAT(std::vector<float>(t.values<float>().begin(), t.values<float>().end()),
              ElementsAre(8, -8, 9, -9));
  EXPECT_TRUE(all[2].info.is_last_in_epoch);
  EXPECT_EQ(all[2].info.remainder, 2u);
}

TEST(Collate, IntegersThroughThePipelineBecomeOneTensorPerBatch) {
  std::vector<std::int64_t> values(10);
  for (int i = 0; i < 10; ++i) values[i] = i * i;
  Loader l(Pipeline::Builder()
               .source(from_range(values, {.name = "squares"}))
               .batch({.size = 4})
               .build());
  std::vector<std::vector<std::int64_t>> got;
  for (const Batch& b : l) got.push_back(int64s(batch_value<std::int64_t>(b)));
  EXPECT_THAT(
      got, ElementsAre(ElementsAre(0, 1, 4, 9), ElementsAre(16, 25, 36, 49), ElementsAre(64, 81)));
}

// ---- device_copy ----

TEST(FromRange, DeviceCopyRunsToDeviceOnTheCollatedValue) {
  std::vector<Marked> values(6);
  for (int i = 0; i < 6; ++i) values[i].value = i;
  Loader l(Pipeline::Builder()
               .source(from_range(values, {.name = "marked"}))
               .batch({.size = 4})
               .device_copy({.device = "cpu"})
               .build());
  int seen = 0;
  for (const Batch& b : l)
    for (const Marked& m : batch_value<Marked>(b)) {
      EXPECT_TRUE(m.moved);
      EXPECT_EQ(m.value, seen++);
    }
  EXPECT_EQ(seen, 6);
}

TEST(FromRange, TensorsStayOnTheHostWithAHostTarget) {
  std::vector<int> values{1, 2, 3};
  Loader l(Pipeline::Builder()
               .source(from_range(values, {.name = "ints"}))
               .batch({.size = 3})
               .device_copy({.device = "cpu"})
               .build());
  auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(batch_value<int>(*b).device().kind, MemoryKind::kHost);
  EXPECT_EQ(b->fence, nullptr);
}

// ---- the forward source's value table ----

TEST(FromRange, ForwardSourceHoldsValuesUntilReleased) {
  SourceSpec spec = from_producer(
      [](std::uint64_t e) {
        return Names{e, 0, 10};
      },
      {.name = "names"});
  SourceParts parts = spec.factory("iterable", 0);
  auto* node = dynamic_cast<detail::StreamNodeBase*>(parts.node.get());
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->size(0), kUnknownSize);
  node->start_epoch(2);
  std::vector<Ref> refs(4);
  ASSERT_EQ(node->pull(refs), 4u);
  EXPECT_EQ(refs[3], (Ref{0, 2, 3}));  // shard = epoch
  EXPECT_EQ(node->held(), 4u);
  Sample s;
  parts.store->read(refs[1], s);
  EXPECT_EQ(s.user.get<std::string>(), "e2-1");
  EXPECT_EQ(s.ref, refs[1]);
  // Each read is a copy: changing it leaves the held value alone.
  s.user.get<std::string>() = "changed";
  Sample again;
  parts.store->read(refs[1], again);
  EXPECT_EQ(again.user.get<std::string>(), "e2-1");
  parts.store->release(std::span<const Ref>(refs).first(2));
  EXPECT_EQ(node->held(), 2u);
  try {
    parts.store->read(refs[0], s);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "'names' holds no value for element 0 of epoch 2: it was released (its batch was "
              "assembled) or never produced");
  }
}

TEST(FromRange, LoaderReleasesEveryValue) {
  // Values are held from pull() until their batch is assembled: a long run must not grow.
  SourceSpec spec = from_producer(
      [](std::uint64_t e) {
        return Names{e, 0, 2000};
      },
      {.name = "names"});
  auto factory = spec.factory;
  std::atomic<detail::StreamNodeBase*> node{nullptr};
  spec.factory = [&](const std::string& name, std::uint32_t id) {
    SourceParts parts = factory(name, id);
    node = dynamic_cast<detail::StreamNodeBase*>(parts.node.get());
    return parts;
  };
  Loader l(Pipeline::Builder().source(spec).batch({.size = 8}).build(), {.epochs = 3});
  std::size_t batches = 0;
  std::size_t most = 0;
  while (auto b = l.next()) {
    ++batches;
    most = std::max(most, node.load()->held());
  }
  EXPECT_EQ(batches, 750u);
  // At most what is in flight: the look-ahead and a few groups of at most kGroupMax cheap
  // batches (graph/loader_runtime_parts.h) between the input node and the consumer — messages
  // in flight, the one being assembled, the consumer's last refill; up to 936 values were seen
  // on a loaded 2-core machine with groups of 32. A value never released would hold all 6 000
  // produced.
  EXPECT_LE(most, 8u + 6 * loader_detail::kGroupMax * 8);
  EXPECT_EQ(node.load()->held(), 0u);
}

// ---- misuse ----

TEST(FromRange, MissingNameIsAConfigError) {
  std::vector<int> v{1};
  try {
    from_range(v, {});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "iterable.name");
    EXPECT_EQ(std::string(e.what()),
              "from_range needs options.name: a C++ range cannot be hashed, so its name stands "
              "for the data in the fingerprint");
  }
}

TEST(FromRange, SizeContradictingTheRangeIsAConfigError) {
  std::vector<int> v(16);
  try {
    from_range(v, {.name = "v", .size = 10});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "iterable.size");
    EXPECT_EQ(std::string(e.what()), "'v' holds 16 elements, but options.size says 10");
  }
}

TEST(FromRange, RangeThatChangedSinceTheBuildIsAConfigError) {
  std::vector<int> v(16);
  Pipeline p = Pipeline::Builder().source(from_range(v, {.name = "v"})).batch({.size = 4}).build();
  v.push_back(1);
  try {
    Loader l(p);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "'v' held 16 elements when the pipeline was built and holds 17 now: a range must "
              "not change while its pipeline is in use");
  }
}

TEST(FromRange, MapValueOfTheWrongTypeNamesBothTypes) {
  std::vector<int> v{1, 2};
  Loader l(Pipeline::Builder()
               .source(from_range(v, {.name = "v"}))
               .map(map_value<Doc>([](Doc&) {}), {.name = "docs"})
               .batch({.size = 2})
               .build());
  try {
    l.next();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "node 'docs': map_value<flowstate::fr_test::Doc>: record 0:0 holds a user value "
              "of type int, not flowstate::fr_test::Doc");
  }
}

TEST(FromRange, ChangedTypeWithoutItsCollateIsADataError) {
  std::vector<int> v{1, 2};
  Loader l(Pipeline::Builder()
               .source(from_range(v, {.name = "v"}))
               .map(map_value<int, Doc>([](int& i) {
                      return Doc{"", i};
                    }),
                    {.name = "to_doc"})
               .batch({.size = 2})
               .build());
  try {
    l.next();
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()),
              "node 'batch': sample 0 (record 0:0) holds a user value of type "
              "flowstate::fr_test::Doc, but the batch collates int (Collate<int>); after a "
              "map_value that changes the type, give batch .user_collate = "
              "collate_user<NewType>()");
  }
}

TEST(FromRange, BatchValueOfTheWrongTypeNamesBothTypes) {
  Batch b;
  b.user = UserValue::make(std::vector<Doc>{});
  try {
    batch_value<int>(b);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "batch_value<int>: the batch holds std::vector<flowstate::fr_test::Doc, "
              "std::allocator<flowstate::fr_test::Doc> >, not flowstate::Tensor "
              "(Collate<int>::type)");
  }
  try {
    batch_value<Doc>(Batch{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "batch_value<flowstate::fr_test::Doc>: the batch holds nothing, not "
              "std::vector<flowstate::fr_test::Doc, std::allocator<flowstate::fr_test::Doc> > "
              "(Collate<flowstate::fr_test::Doc>::type)");
  }
}

TEST(FromRange, ReplayOfARangeThatShrankIsACheckpointError) {
  // The fingerprint cannot see inside a view of unknown length: the replay notices instead.
  int limit = 20;
  auto make = [&] {
    auto v = std::views::iota(0, 100) | std::views::filter([&](int i) { return i < limit; });
    return Pipeline::Builder()
        .source(from_range(v, {.name = "shrinking"}))
        .batch({.size = 4})
        .build();
  };
  std::string state;
  {
    Loader l(make());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.next());
    state = l.state();  // after 3 batches: the source's cursor is 12
  }
  limit = 5;
  Loader resumed(make());
  resumed.load_state(state);
  try {
    resumed.next();
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()),
              "node 'iterable': 'shrinking' ended after 5 elements while replaying epoch 0 to "
              "element 12: it yields fewer elements than when the state was saved");
  }
}

TEST(FromRange, ProducerLoadFailureIsACheckpointError) {
  auto make = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Names{e, 0, 40};
            },
            {.name = "names"}))
        .batch({.size = 4})
        .build();
  };
  // A real state, loaded by a producer that refuses every position.
  struct Picky : Names {
    void load(std::string_view) { throw std::invalid_argument("bad position"); }
  };
  auto picky = [] {
    return Pipeline::Builder()
        .source(from_producer(
            [](std::uint64_t e) {
              return Picky{{e, 0, 40}};
            },
            {.name = "names"}))
        .batch({.size = 4})
        .build();
  };
  std::string state;
  {
    Loader l(make());
    ASSERT_TRUE(l.next());
    state = l.state();
  }
  Loader resumed(picky());
  try {
    resumed.load_state(state);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), "'names' could not load its saved position: bad position");
  }
}

}  // namespace
}  // namespace flowstate
