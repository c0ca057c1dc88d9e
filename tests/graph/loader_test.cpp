#include "flowstate/graph/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader_runtime_parts.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::BatchTrace;
using testing::drain;
using testing::record_index;
using testing::TempDir;

std::vector<std::uint64_t> indices(const Batch& b, std::size_t record_bytes) {
  const Tensor& t = b["data"];
  std::vector<std::uint64_t> out;
  for (std::int64_t i = 0; i < t.shape()[0]; ++i)
    out.push_back(record_index(static_cast<const std::byte*>(t.data()) + i * record_bytes));
  return out;
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 1000, 64, 3); }
  Pipeline::Builder base(std::uint64_t seed = 1234) const {
    Pipeline::Builder b;
    b.seed(seed).records({.paths = {glob_}, .record_bytes = 64});
    return b;
  }
  /// Buffer shuffle, a map that adds a drawn "noise" field (slowing some samples down so
  /// workers finish out of order, and counting in `elsewhere` the samples it sees on a
  /// thread other than `caller`), batches of 32.
  Pipeline noisy(std::thread::id caller = {}, std::atomic<int>* elsewhere = nullptr) const {
    return base()
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 50})
        .map(
            [caller, elsewhere](Sample& s, MapContext& ctx) {
              if (elsewhere != nullptr && std::this_thread::get_id() != caller)
                elsewhere->fetch_add(1);
              if (ctx.rng.below(10) == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(50));
              Tensor noise(DType::kUInt64, Shape{1});
              noise.values<std::uint64_t>()[0] = ctx.rng();
              s.set("noise", noise);
            },
            {.name = "noise"})
        .batch({.size = 32})
        .build();
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(LoaderTest, DeliversEveryRecordOncePerEpoch) {
  Loader loader(
      base().shuffle({.mode = ShuffleMode::kBuffer, .size = 100}).batch({.size = 64}).build(),
      {.epochs = 2});
  std::vector<std::multiset<std::uint64_t>> seen(2);
  std::uint64_t expect_step = 0;
  for (const Batch& b : loader) {
    EXPECT_EQ(b.info.step, expect_step++);
    for (auto i : indices(b, 64)) seen[b.info.epoch].insert(i);
  }
  EXPECT_EQ(expect_step, 2u * 16u);
  for (auto& s : seen) {
    ASSERT_EQ(s.size(), 1000u);
    EXPECT_EQ(std::set<std::uint64_t>(s.begin(), s.end()).size(), 1000u);
  }
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
}

TEST_F(LoaderTest, BatchInfoTellsTheTrainerWhereItIs) {
  Loader loader(base().batch({.size = 64}).build(), {.epochs = 2});
  std::vector<Batch> all;
  while (auto b = loader.next()) all.push_back(std::move(*b));
  ASSERT_EQ(all.size(), 32u);  // 15 full + 1 of 40, twice
  for (const auto& b : all) {
    EXPECT_EQ(b.info.batches_in_epoch, 16u);
    bool last = b.info.index_in_epoch == 15;
    EXPECT_EQ(b.info.is_last_in_epoch, last);
    EXPECT_EQ(b.info.num_samples, last ? 40u : 64u);
    EXPECT_EQ(b.info.remainder, last ? 40u : 0u);
    EXPECT_EQ(b.info.refs.size(), b.info.num_samples);
    EXPECT_EQ(b["data"].shape()[0], static_cast<std::int64_t>(b.info.num_samples));
    // Provenance matches the bytes.
    auto idx = indices(b, 64);
    for (std::size_t i = 0; i < idx.size(); ++i) EXPECT_EQ(b.info.refs[i].index, idx[i]);
  }
  EXPECT_EQ(all[16].info.epoch, 1u);
  EXPECT_EQ(all[16].info.index_in_epoch, 0u);
}

TEST_F(LoaderTest, DropLastDropsTheShortBatch) {
  Loader loader(base().batch({.size = 64, .drop_last = true}).build(), {.epochs = 2});
  auto t = drain(loader);
  ASSERT_EQ(t.size(), 30u);
  EXPECT_TRUE(t[14].last);
  EXPECT_EQ(t[14].remainder, 0u);
  EXPECT_EQ(t[15].epoch, 1u);
}

TEST_F(LoaderTest, OutputIsIdenticalForOneTwoAndFourWorkersAndInline) {
  // `workers: inline`: no thread of the loader's, each batch planned and made in next() on the
  // caller's thread; the map counts the samples made elsewhere.
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  std::vector<std::vector<BatchTrace>> runs;
  std::vector<int> made_elsewhere;
  for (int w : {1, 2, 4, static_cast<int>(kInline)}) {
    elsewhere = 0;
    Loader loader(noisy(caller, &elsewhere), {.epochs = 2, .workers = w});
    runs.push_back(drain(loader));
    made_elsewhere.push_back(elsewhere.load());
  }
  ASSERT_EQ(runs[0].size(), 64u);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  EXPECT_EQ(runs[0], runs[3]);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_GT(made_elsewhere[i], 0) << i;  // threads ran it
  EXPECT_EQ(made_elsewhere[3], 0);                                           // inline: none did
}

TEST_F(LoaderTest, StateSavedWithOneWorkerRestoresWithFour) {
  auto make = [&] {
    return base().shuffle({.mode = ShuffleMode::kBuffer, .size = 128}).batch({.size = 32}).build();
  };
  Loader full(make(), {.epochs = 2, .workers = 1});
  auto expected = drain(full);
  Loader first(make(), {.epochs = 2, .workers = 1, .prefetch = 1});
  auto got = drain(first, 20);
  std::string state = first.state();
  Loader second(make(), {.epochs = 2, .workers = 4, .prefetch = 8});
  second.load_state(state);
  auto rest = drain(second);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, expected);
}

// `workers: inline` reports itself, is the pipeline's too, and a state moves between it and
// threads in both directions.
TEST_F(LoaderTest, InlineStatsAndStatesMoveToAndFromThreads) {
  auto make = [&] { return noisy(); };
  const int kInlineWorkers = static_cast<int>(kInline);
  Loader threaded(make(), {.epochs = 2, .workers = 2});
  const auto expected = drain(threaded);
  Loader in(make(), {.epochs = 2, .workers = kInlineWorkers});
  EXPECT_EQ(drain(in), expected);
  EXPECT_FALSE(in.next().has_value());  // stays at the end
  const LoaderStats s = in.stats();
  EXPECT_TRUE(s.workers_inline);
  EXPECT_FALSE(threaded.stats().workers_inline);
  EXPECT_EQ(s.workers, 1);
  EXPECT_EQ(s.stages[1].items, expected.size());
  EXPECT_EQ(s.consumer_waits, 0u);
  // The pipeline's own `workers` says it too.
  Loader from_pipeline(base().workers(kInlineWorkers).batch({.size = 32}).build(), {});
  drain(from_pipeline);
  EXPECT_TRUE(from_pipeline.stats().workers_inline);
  EXPECT_THROW(base().workers(-2), ConfigError);
  testing::expect_save_restore(make, {.epochs = 2, .workers = kInlineWorkers},
                               {.epochs = 2, .workers = 3});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 2},
                               {.epochs = 2, .workers = kInlineWorkers});
}

TEST_F(LoaderTest, InlineMakesCheapBatchesAFewAtATime) {
  // The consumer's thread plans, assembles and delivers cheap batches in groups of at most
  // kInlineGroupMax (graph/loader_runtime_parts.h), as the graph groups them for its workers:
  // the same batches, fewer messages.
  auto make = [&] { return base().shuffle({.mode = ShuffleMode::kGlobal}).batch({.size = 10}); };
  Loader threaded(make().build(), {.epochs = 2, .workers = 2});
  const std::vector<BatchTrace> expected = drain(threaded);
  Loader in(make().build(), {.epochs = 2, .workers = static_cast<int>(kInline)});
  EXPECT_EQ(drain(in), expected);
  const LoaderStats s = in.stats();
  ASSERT_EQ(s.stages[0].items, 200u);  // plans
  // Never more than kInlineGroupMax batches a message (the end travels with the last group).
  EXPECT_GE(s.messages, 200u / loader_detail::kInlineGroupMax);
  const double per_batch_us =
      1e-3 * (static_cast<double>(s.stages[0].busy_ns) / static_cast<double>(s.stages[0].items) +
              static_cast<double>(s.stages[1].busy_ns) / static_cast<double>(s.stages[1].items));
  if (per_batch_us < 50) {  // a group of 8 holds less than the 500 µs target
    EXPECT_LT(s.messages, 100u) << "the cheap batches were made one by one: " << per_batch_us;
  }
  testing::expect_save_restore([&] { return make().build(); },
                               {.epochs = 2, .workers = static_cast<int>(kInline)},
                               {.epochs = 2, .workers = 2});
}

TEST_F(LoaderTest, RanksPartitionTheDataSet) {
  for (ShardMode mode : {ShardMode::kInterleave, ShardMode::kContiguous}) {
    std::multiset<std::uint64_t> all;
    for (std::uint64_t rank = 0; rank < 3; ++rank) {
      Loader loader(base()
                        .shard({.rank = rank, .world = 3, .mode = mode})
                        .shuffle({.mode = ShuffleMode::kGlobal})
                        .batch({.size = 10})
                        .build(),
                    {.epochs = 2});
      std::vector<std::multiset<std::uint64_t>> per_epoch(2);
      while (auto b = loader.next())
        for (auto i : indices(*b, 64)) per_epoch[b->info.epoch].insert(i);
      EXPECT_EQ(per_epoch[0], per_epoch[1]);  // the same share each epoch
      // uneven: pad (the default): 334 each, the two short ranks repeat a record as padding.
      EXPECT_EQ(per_epoch[0].size(), 334u);
      all.insert(per_epoch[0].begin(), per_epoch[0].end());
    }
    ASSERT_EQ(all.size(), 1002u);
    EXPECT_EQ(std::set<std::uint64_t>(all.begin(), all.end()).size(), 1000u)
        << "a record is missing";
  }
}

TEST_F(LoaderTest, ShardReadsRankAndWorldFromTheLauncher) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ShardOptions r = ShardOptions{}.resolved();
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  EXPECT_EQ(*r.rank, 1u);
  EXPECT_EQ(*r.world, 4u);
  ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  r = ShardOptions{}.resolved();
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(*r.rank, 2u);
  EXPECT_EQ(*r.world, 3u);
  ::setenv("SLURM_PROCID", "x", 1);
  EXPECT_THROW(ShardOptions{}.resolved(), ConfigError);
  ::unsetenv("SLURM_PROCID");
  try {
    ShardOptions{.rank = 3, .world = 3}.resolved();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "shard.rank");
    EXPECT_STREQ(e.what(), "rank 3 is out of range for world 3");
  }
}

TEST_F(LoaderTest, AnEmptyDataSetEndsAtOnce) {
  TempDir empty;
  testing::write_records(empty.str(), 0, 8, 1);
  auto p = Pipeline::Builder()
               .records({.paths = {empty / "*.bin"}, .record_bytes = 8})
               .shuffle({.mode = ShuffleMode::kBuffer, .size = 10})
               .batch({.size = 4})
               .build();
  Loader once(p, {.epochs = 3});
  EXPECT_FALSE(once.next().has_value());
  Loader forever(p, {.epochs = 0});
  EXPECT_FALSE(forever.next().has_value());
}

TEST_F(LoaderTest, HandlesOneByteAndOneMebibyteRecords) {
  for (std::size_t rb : {std::size_t{1}, std::size_t{1} << 20}) {
    TempDir d;
    std::uint64_t n = rb == 1 ? 300 : 6;
    auto glob = testing::write_records(d.str(), n, rb, 2);
    auto make = [&] {
      return Pipeline::Builder()
          .records({.paths = {glob}, .record_bytes = rb})
          .shuffle({.mode = ShuffleMode::kGlobal})
          .batch({.size = 4})
          .build();
    };
    Loader loader(make(), {.epochs = 1});
    std::uint64_t samples = 0;
    while (auto b = loader.next()) {
      EXPECT_EQ(b->fields.at("data").shape()[1], static_cast<std::int64_t>(rb));
      samples += b->info.num_samples;
    }
    EXPECT_EQ(samples, n);
    testing::expect_save_restore(make, {.epochs = 2}, {.epochs = 2, .workers = 4});
  }
}

TEST_F(LoaderTest, AMapThatThrowsReachesTheConsumerWithTheNodeName) {
  for (const int workers : {2, static_cast<int>(kInline)}) {
    SCOPED_TRACE(workers);
    Loader loader(base()
                      .map(
                          [](Sample& s, MapContext&) {
                            if (s.ref.index == 500) throw std::runtime_error("bad record 500");
                          },
                          {.name = "picky"})
                      .batch({.size = 10})
                      .build(),
                  {.epochs = 1, .workers = workers});
    std::size_t delivered = 0;
    try {
      while (loader.next()) ++delivered;
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.node(), "picky");
      EXPECT_STREQ(e.what(), "node 'picky': bad record 500");
    }
    EXPECT_EQ(delivered, 50u);           // every batch before the failing one
    EXPECT_THROW(loader.next(), Error);  // and again
  }
}

TEST_F(LoaderTest, DestroyingMidEpochReturnsPromptly) {
  auto p = base()
               .map([](Sample&, MapContext&) {
                 std::this_thread::sleep_for(std::chrono::microseconds(200));
               })
               .batch({.size = 8})
               .prefetch({.depth = 8})
               .build();
  for (int trial = 0; trial < 5; ++trial) {
    auto loader = std::make_unique<Loader>(p, LoaderOptions{.epochs = 0, .workers = 4});
    for (int i = 0; i < trial * 3; ++i) ASSERT_TRUE(loader->next().has_value());
    auto t0 = std::chrono::steady_clock::now();
    loader.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  }
}

TEST_F(LoaderTest, ABatchMayOutliveItsLoader) {
  std::optional<Batch> kept;
  {
    Loader loader(base().batch({.size = 16}).build());
    kept = loader.next();
  }
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(indices(*kept, 64).size(), 16u);
}

TEST_F(LoaderTest, RunsForeverWhenAskedTo) {
  Loader loader(base().batch({.size = 100}).build(), {.epochs = 0});
  auto t = drain(loader, 35);
  ASSERT_EQ(t.size(), 35u);
  EXPECT_EQ(t[34].epoch, 3u);
  EXPECT_EQ(t[34].step, 34u);
}

TEST_F(LoaderTest, SkipDropsStepsWithoutReadingThemAndKeepsNumbering) {
  std::atomic<int> reads{0};
  auto make = [&] {
    return base()
        .map([&](Sample&, MapContext&) { ++reads; }, {.name = "count"})
        .batch({.size = 100})
        .build();
  };
  Loader loader(make(), {.epochs = 2});
  auto head = drain(loader, 2);  // steps 0, 1
  loader.skip(3, 5);
  loader.skip(5, 6);  // overlaps: merges into 3..6
  reads = 0;
  auto rest = drain(loader);
  std::vector<std::uint64_t> steps;
  for (const auto& t : rest) steps.push_back(t.step);
  EXPECT_EQ(steps,
            (std::vector<std::uint64_t>{2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(reads.load(), 14 * 100);  // nothing of the skipped steps was read
  EXPECT_EQ(loader.state_struct().skips,
            (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{3, 6}}));
}

TEST_F(LoaderTest, SkippingTheEndOfAnEpochMovesTheLastMark) {
  Loader loader(base().batch({.size = 100}).build(), {.epochs = 2});
  loader.skip(8, 9);
  auto t = drain(loader);
  ASSERT_EQ(t.size(), 18u);
  EXPECT_EQ(t[7].step, 7u);
  EXPECT_TRUE(t[7].last);
  EXPECT_EQ(t[8].step, 10u);
  EXPECT_EQ(t[8].epoch, 1u);
}

TEST_F(LoaderTest, SkipRejectsReversedAndPassedRanges) {
  Loader loader(base().batch({.size = 100}).build());
  drain(loader, 3);
  try {
    loader.skip(9, 8);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "skip range 9:8 is reversed (first > last)");
  }
  try {
    loader.skip(2, 4);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "skip range 2:4 starts at or before step 2, which was already delivered");
  }
}

TEST_F(LoaderTest, LoadStateRefusesAPipelineWhoseOutputDiffers) {
  Loader a(base().batch({.size = 100}).build());
  drain(a, 2);
  std::string state = a.state();
  Loader b(base().batch({.size = 50}).build());
  try {
    b.load_state(state);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("batch.size: 100 in checkpoint, 50 now"),
              std::string::npos)
        << e.what();
  }
  Loader c(base(99).batch({.size = 100}).build());
  try {
    c.load_state(state);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("seed: 1234 in checkpoint, 99 now"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(c.load_state("not a state"), CheckpointError);
  EXPECT_THROW(c.load_state(state.substr(0, state.size() / 2)), CheckpointError);
}

TEST_F(LoaderTest, StatsReportEveryStage) {
  Loader loader(base().batch({.size = 10}).build(), {.workers = 2});
  drain(loader);
  LoaderStats s = loader.stats();
  ASSERT_EQ(s.stages.size(), 3u);
  EXPECT_EQ(s.stages[1].name, "assemble");
  EXPECT_EQ(s.stages[1].items, 100u);
  EXPECT_EQ(s.stages[1].concurrency, 2);
  EXPECT_GT(s.stages[1].busy_ns, 0u);
}

TEST_F(LoaderTest, CheapBatchesTravelInGroupsAndCostlyOnesAlone) {
  // 100 batches of 10 × 64 bytes cost a few µs each: they share messages. The batches are
  // those of a run where each travels alone (a map that sleeps 30 µs a sample, 300 µs a batch).
  auto cheap = base().shuffle({.mode = ShuffleMode::kGlobal}).batch({.size = 10}).build();
  Loader grouped(cheap, {.epochs = 2, .workers = 2});
  const std::vector<BatchTrace> a = drain(grouped);
  const LoaderStats s = grouped.stats();
  EXPECT_EQ(s.stages[0].items, 200u);  // plans
  // A group holds ~500 µs of measured work (graph/loader_runtime_parts.h). What a batch costs
  // depends on the build (sanitizers) and the load, so the expectation follows the measure.
  const double per_batch_us =
      1e-3 * (static_cast<double>(s.stages[0].busy_ns) / static_cast<double>(s.stages[0].items) +
              static_cast<double>(s.stages[1].busy_ns) / static_cast<double>(s.stages[1].items));
  if (per_batch_us < 100) {
    EXPECT_LT(s.messages, 100u) << "the cheap batches were not grouped: " << per_batch_us;
  } else if (per_batch_us < 250) {
    EXPECT_LT(s.messages, 200u) << "no batches were grouped: " << per_batch_us;
  }
  auto costly = base()
                    .shuffle({.mode = ShuffleMode::kGlobal})
                    .map([](Sample&, MapContext&) {
                      std::this_thread::sleep_for(std::chrono::microseconds(30));
                    })
                    .batch({.size = 10})
                    .build();
  Loader alone(costly, {.epochs = 2, .workers = 2});
  const std::vector<BatchTrace> b = drain(alone);
  EXPECT_GE(alone.stats().messages, 200u);  // one per batch (and one for the end)
  ASSERT_EQ(a.size(), 200u);
  EXPECT_EQ(a, b);
}

TEST(PipelineBuilder, ChecksNodeOrder) {
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), text);
    }
  };
  RecordsOptions ro{.paths = {"x"}, .record_bytes = 1};
  expect_error([&] { Pipeline::Builder().batch({.size = 1}).build(); },
               "a pipeline starts with a source");
  expect_error([&] { Pipeline::Builder().records(ro).build(); },
               "a pipeline needs exactly one batch node");
  expect_error([&] { Pipeline::Builder().records(ro).batch({.size = 1}).shuffle({}).build(); },
               "'shuffle' must come before any map, filter or pack and before batch");
  expect_error([&] { Pipeline::Builder().batch({.size = 0}); },
               "batch.size: 0 is out of range (must be at least 1)");
  // (.depth = 0 is kAuto: tuned while running, graph/autotune.h.)
  expect_error([&] { Pipeline::Builder().prefetch({.depth = 5000}); },
               "prefetch.depth: 5000 is out of range (must be between 1 and 4096)");
}

}  // namespace
}  // namespace flowstate
