// Autotuning (`workers: auto`, `prefetch: {depth: auto}`): the tuner's decisions on synthetic
// intervals (graph/autotune.h), and end to end that a tuned Loader delivers exactly the batches
// of a fixed one, also across a save and a restore in either direction.
#include "flowstate/graph/autotune.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

AutotuneSample interval(std::uint64_t batches, double busy, double wait, double spine = 0.2) {
  AutotuneSample s;
  s.seconds = 1;
  s.batches = batches;
  s.assemble_busy = busy;
  s.consumer_wait = wait;
  s.spine_busy = spine;
  return s;
}

/// Decides on every interval (the Loader's tuner waits for two, see Tuning::settle, judge).
Autotuner::Tuning step_by_step() {
  Autotuner::Tuning t;
  t.settle = 1;
  t.judge = 1;
  return t;
}

AutotuneLimits workers_only(int max_workers = 8) {
  AutotuneLimits l;
  l.workers = true;
  l.max_workers = max_workers;
  return l;
}

TEST(Autotuner, AddsAWorkerWhileTheConsumerWaitsOnBusyWorkersAndKeepsItWhenItPays) {
  Autotuner t(workers_only(), {2, 4}, step_by_step());
  EXPECT_EQ(t.update(interval(100, 0.95, 0.5)).workers, 3) << t.reason();
  EXPECT_EQ(t.update(interval(140, 0.95, 0.3)).workers, 3) << t.reason();  // +40%: kept
  EXPECT_EQ(t.update(interval(140, 0.95, 0.3)).workers, 4) << t.reason();  // still short
  EXPECT_EQ(t.setting().depth, 4u);                                        // not tuned
}

TEST(Autotuner, UndoesAWorkerThatDidNotPayAndDoesNotRetryAtOnce) {
  Autotuner t(workers_only(), {2, 4}, step_by_step());
  EXPECT_EQ(t.update(interval(100, 0.95, 0.5)).workers, 3);
  EXPECT_EQ(t.update(interval(101, 0.95, 0.5)).workers, 2) << t.reason();  // +1%: undone
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(t.update(interval(100, 0.95, 0.5)).workers, 2) << "interval " << i;
  EXPECT_EQ(t.changes(), 2u);
}

TEST(Autotuner, TriesAWorkerWhenADeeperQueueDidNotPay) {
  AutotuneLimits l = workers_only();
  l.depth = true;
  Autotuner t(l, {2, 4}, step_by_step());
  // The consumer waits on idle workers: first a deeper queue; it does not pay, so a worker.
  EXPECT_EQ(t.update(interval(100, 0.5, 0.3)).depth, 8u) << t.reason();
  EXPECT_EQ(t.update(interval(100, 0.5, 0.3)).depth, 4u) << t.reason();
  const AutotuneSetting next = t.update(interval(100, 0.5, 0.3));
  EXPECT_EQ(next.workers, 3) << t.reason();
  EXPECT_EQ(next.depth, 4u);
}

TEST(Autotuner, NoMoreWorkersWhenTheSpineIsTheBottleneckOrAtTheMaximum) {
  Autotuner spine_bound(workers_only(), {2, 4}, step_by_step());
  EXPECT_EQ(spine_bound.update(interval(100, 0.95, 0.5, /*spine=*/0.97)).workers, 2);
  Autotuner at_max(workers_only(2), {2, 4}, step_by_step());
  EXPECT_EQ(at_max.update(interval(100, 0.95, 0.5)).workers, 2);
}

TEST(Autotuner, DropsIdleWorkersUnlessThatCostsThroughput) {
  Autotuner t(workers_only(), {4, 4}, step_by_step());
  // The consumer never waits; 4 workers at 20%: 3 would be at 27%.
  EXPECT_EQ(t.update(interval(100, 0.2, 0.0)).workers, 3) << t.reason();
  EXPECT_EQ(t.update(interval(99, 0.27, 0.0)).workers, 3) << t.reason();  // -1%: kept
  EXPECT_EQ(t.update(interval(99, 0.27, 0.0)).workers, 2) << t.reason();  // 2 at 40%
  EXPECT_EQ(t.update(interval(80, 0.5, 0.0)).workers, 3) << t.reason();   // -20%: undone
}

TEST(Autotuner, DeepensThePrefetchWhenTheConsumerWaitsOnIdleWorkers) {
  AutotuneLimits l;
  l.depth = true;
  l.max_depth = 64;
  Autotuner t(l, {2, 4}, step_by_step());
  EXPECT_EQ(t.update(interval(100, 0.5, 0.2)).depth, 8u) << t.reason();
  EXPECT_EQ(t.update(interval(120, 0.5, 0.1)).depth, 8u) << t.reason();  // kept
  EXPECT_EQ(t.update(interval(120, 0.5, 0.1)).depth, 16u) << t.reason();
  EXPECT_EQ(t.update(interval(120, 0.5, 0.1)).depth, 8u) << t.reason();  // no gain: undone
  EXPECT_EQ(t.setting().workers, 2);                                     // not tuned
}

TEST(Autotuner, HalvesADeepQueueTheConsumerNoLongerWaitsOnDownToTheStartDepth) {
  AutotuneLimits l;
  l.depth = true;
  Autotuner t(l, {2, 16}, step_by_step());
  EXPECT_EQ(t.update(interval(100, 0.5, 0.0)).depth, 8u) << t.reason();
  EXPECT_EQ(t.update(interval(99, 0.5, 0.0)).depth, 8u) << t.reason();  // -1%: kept
  EXPECT_EQ(t.update(interval(99, 0.5, 0.0)).depth, 4u) << t.reason();
  EXPECT_EQ(t.update(interval(80, 0.5, 0.0)).depth, 8u) << t.reason();  // -20%: undone
  for (int i = 0; i < 5; ++i)  // and not tried again at once
    EXPECT_EQ(t.update(interval(99, 0.5, 0.0)).depth, 8u) << "interval " << i;
  Autotuner at_start(l, {2, 4}, step_by_step());
  EXPECT_EQ(at_start.update(interval(100, 0.5, 0.0)).depth, 4u) << at_start.reason();
  EXPECT_EQ(at_start.changes(), 0u);
}

TEST(Autotuner, AsksMoreOfADeeperQueueThanOfAWorker) {
  AutotuneLimits l;
  l.depth = true;
  Autotuner t(l, {2, 4}, step_by_step());
  EXPECT_EQ(t.update(interval(100, 0.5, 0.2)).depth, 8u);
  EXPECT_EQ(t.update(interval(105, 0.5, 0.2)).depth, 4u) << t.reason();  // +5%: undone
  Autotuner w(workers_only(), {2, 4}, step_by_step());
  EXPECT_EQ(w.update(interval(100, 0.95, 0.5)).workers, 3);
  EXPECT_EQ(w.update(interval(105, 0.95, 0.5)).workers, 3) << w.reason();  // +5%: kept
}

TEST(Autotuner, KeepsTheBatchesInFlightWithinTheMemoryBudget) {
  AutotuneLimits l;
  l.workers = l.depth = true;
  l.max_workers = 8;
  l.memory_budget = 10 << 20;  // ten 1 MiB batches
  Autotuner t(l, {4, 16}, step_by_step());
  AutotuneSample s = interval(100, 0.95, 0.5);
  s.batch_bytes = 1 << 20;
  AutotuneSetting cut = t.update(s);
  EXPECT_EQ(cut.workers, 4);
  EXPECT_EQ(cut.depth, 6u) << t.reason();  // 4 + 6 batches of 1 MiB
  // Growing further never passes the budget.
  for (int i = 0; i < 50; ++i) {
    s.batches += 50;
    const AutotuneSetting next = t.update(s);
    EXPECT_LE((static_cast<std::uint64_t>(next.workers) + next.depth) * s.batch_bytes,
              l.memory_budget);
  }
  // A budget under workers alone: workers go down too, to one at the least.
  Autotuner tight({.workers = true, .depth = true, .max_workers = 8, .memory_budget = 3 << 20},
                  {4, 4}, step_by_step());
  const AutotuneSetting t2 = tight.update(s);
  EXPECT_EQ(t2.workers, 2);
  EXPECT_EQ(t2.depth, 1u);
}

TEST(Autotuner, ClimbsOnTheMeanOfSeveralIntervals) {
  Autotuner t(workers_only(), {2, 4});  // the Loader's tuning: settle 2, judge 2
  EXPECT_EQ(t.update(interval(100, 0.95, 0.5)).workers, 2) << t.reason();  // settling
  EXPECT_EQ(t.update(interval(120, 0.95, 0.5)).workers, 3) << t.reason();  // mean 110
  // One lucky interval is not enough: the mean of two decides (125 vs 110: +14%, kept).
  EXPECT_EQ(t.update(interval(150, 0.95, 0.5)).workers, 3) << t.reason();
  EXPECT_EQ(t.update(interval(100, 0.95, 0.5)).workers, 3) << t.reason();
  EXPECT_EQ(t.update(interval(125, 0.95, 0.5)).workers, 4) << t.reason();  // next step
  // Its two intervals average 112: less than 3% over 3 workers' 125, so it is undone.
  EXPECT_EQ(t.update(interval(140, 0.95, 0.5)).workers, 4) << t.reason();
  EXPECT_EQ(t.update(interval(84, 0.95, 0.5)).workers, 3) << t.reason();
}

TEST(Autotuner, JudgesNothingOnTooFewBatches) {
  Autotuner t(workers_only(), {2, 4}, step_by_step());
  EXPECT_EQ(t.update(interval(2, 0.95, 0.9)).workers, 2);
  EXPECT_EQ(t.changes(), 0u);
}

class AutotuneLoader : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 3000, 64, 3); }
  /// records -> shuffle -> map (busy for `cost`, adds a field) -> batch -> prefetch
  Pipeline pipeline(int workers = static_cast<int>(kAuto), std::size_t depth = kAuto,
                    std::chrono::microseconds cost = std::chrono::microseconds(5)) const {
    return Pipeline::Builder()
        .seed(9)
        .workers(workers)
        .records({.paths = {glob_}, .record_bytes = 64})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 500})
        .map(
            [cost](Sample& s, MapContext& ctx) {
              const auto until = std::chrono::steady_clock::now() + cost;
              while (std::chrono::steady_clock::now() < until) {
              }
              Tensor t(DType::kUInt64, Shape{});
              t.values<std::uint64_t>()[0] = ctx.rng();
              s.set("noise", std::move(t));
            },
            {.name = "augment"})
        .batch({.size = 16})
        .prefetch({.depth = depth})
        .build();
  }
  static std::vector<std::uint64_t> digests(Loader& l) {
    std::vector<std::uint64_t> out;
    while (auto b = l.next()) out.push_back(b->digest());
    return out;
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(AutotuneLoader, AutoIsAFreeParameter) {
  EXPECT_EQ(pipeline().fingerprint(), pipeline(3, 7).fingerprint());
  EXPECT_NE(pipeline().describe().find("workers: auto (free)"), std::string::npos)
      << pipeline().describe();
  EXPECT_NE(pipeline().describe().find("depth: auto (free)"), std::string::npos);
  EXPECT_THROW(Pipeline::Builder().workers(-2), ConfigError);  // (-1 is kInline)
}

TEST_F(AutotuneLoader, TunedRunsDeliverTheBatchesOfAFixedRun) {
  std::vector<std::uint64_t> fixed;
  {
    Loader l(pipeline(2, 4), {.epochs = 2});
    fixed = digests(l);
  }
  ASSERT_EQ(fixed.size(), 2 * (3000 / 16 + 1));
  for (double interval_s : {0.001, 0.01}) {
    LoaderOptions o{.epochs = 2};
    o.autotune_interval_s = interval_s;
    Loader l(pipeline(), o);
    EXPECT_EQ(digests(l), fixed) << "interval " << interval_s;
    const LoaderStats s = l.stats();
    EXPECT_TRUE(s.workers_auto);
    EXPECT_TRUE(s.prefetch_auto);
    EXPECT_GE(s.workers, 1);
    EXPECT_GE(s.prefetch_depth, 1u);
    EXPECT_GT(s.memory_budget, 0u);
    EXPECT_EQ(s.in_flight_limit, s.prefetch_depth + static_cast<std::size_t>(s.workers));
  }
  // LoaderOptions override the pipeline both ways, and the memory budget binds the depth.
  {
    LoaderOptions o{.epochs = 2, .workers = static_cast<int>(kAuto), .prefetch = kAuto};
    o.memory_budget = 3 * 16 * (64 + 8);  // three batches in flight at most
    o.autotune_interval_s = 0.001;
    Loader l(pipeline(3, 5), o);
    EXPECT_EQ(digests(l), fixed);
    const LoaderStats s = l.stats();
    EXPECT_LE(static_cast<std::size_t>(s.workers) + s.prefetch_depth, 3u);
  }
  {
    Loader l(pipeline(), {.epochs = 2, .workers = 3, .prefetch = 2});
    EXPECT_EQ(digests(l), fixed);
    EXPECT_FALSE(l.stats().workers_auto);
    EXPECT_EQ(l.stats().workers, 3);
    EXPECT_EQ(l.stats().prefetch_depth, 2u);
  }
}

TEST_F(AutotuneLoader, TheTunedWorkerCountGatesTheAssembly) {
  // A budget of two batches forces workers 1 and depth 1 at the first decision; from then on
  // the assembly (this map) must never run on two threads at once.
  std::atomic<int> active{0}, most{0};
  std::atomic<bool> watching{false};
  Pipeline p = Pipeline::Builder()
                   .seed(9)
                   .workers(static_cast<int>(kAuto))
                   .records({.paths = {glob_}, .record_bytes = 64})
                   .map(
                       [&](Sample&, MapContext&) {
                         const int now = active.fetch_add(1) + 1;
                         if (watching.load()) {
                           int m = most.load();
                           while (now > m && !most.compare_exchange_weak(m, now)) {
                           }
                         }
                         std::this_thread::sleep_for(std::chrono::microseconds(20));
                         active.fetch_sub(1);
                       },
                       {.name = "watch"})
                   .batch({.size = 16})
                   .prefetch({.depth = kAuto})
                   .build();
  LoaderOptions o{.epochs = 1};
  o.memory_budget = 2 * 16 * 64;
  o.autotune_interval_s = 0.001;
  Loader l(p, o);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(l.next());
  EXPECT_EQ(l.stats().workers, 1);
  EXPECT_EQ(l.stats().prefetch_depth, 1u);
  // Batches planned before the cut may still be in the assembly: let them drain.
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(l.next());
  watching = true;
  std::size_t rest = 0;
  while (l.next()) ++rest;
  EXPECT_GT(rest, 50u);
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(l.stats().workers, 1);
}

TEST_F(AutotuneLoader, CheckpointsMoveBetweenTunedAndFixedRuns) {
  LoaderOptions tuned{.epochs = 2};
  tuned.autotune_interval_s = 0.001;
  const LoaderOptions fixed{.epochs = 2, .workers = 3, .prefetch = 2};
  testing::expect_save_restore([&] { return pipeline(); }, tuned, fixed);
  testing::expect_save_restore([&] { return pipeline(); }, fixed, tuned);
  // The state of a tuned run loads into a fixed one: the tuned values are not part of it.
  Loader a(pipeline(), tuned);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(a.next());
  Loader b(pipeline(2, 4), fixed);
  b.load_state(a.state());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(a.next()->digest(), b.next()->digest()) << i;
}

TEST_F(AutotuneLoader, YamlTakesAuto) {
  const std::string yaml = "seed: 9\nworkers: auto\nsource: {type: records, paths: \"" + glob_ +
                           "\", record_bytes: 64}\nnodes:\n  - batch: {size: 16}\n"
                           "  - prefetch: {depth: auto}\n";
  const Pipeline p = from_yaml_string(yaml);
  EXPECT_EQ(p.workers(), static_cast<int>(kAuto));
  Loader l(p, {.epochs = 1});
  EXPECT_EQ(digests(l).size(), 3000u / 16 + 1);
  EXPECT_TRUE(l.stats().workers_auto);
  EXPECT_TRUE(l.stats().prefetch_auto);
  // A written 0 is still out of range; `auto` is the way to ask for tuning.
  try {
    from_yaml_string("workers: 0\nsource: {type: records, paths: \"" + glob_ +
                     "\", record_bytes: 64}\nnodes:\n  - batch: {size: 16}\n");
    FAIL() << "workers: 0 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("auto or inline"), std::string::npos) << e.what();
  }
  // `inline`: no tuning, no thread; the batches are the same.
  const Pipeline in =
      from_yaml_string("seed: 9\nworkers: inline\nsource: {type: records, paths: \"" + glob_ +
                       "\", record_bytes: 64}\nnodes:\n  - batch: {size: 16}\n"
                       "  - prefetch: {depth: auto}\n");
  EXPECT_EQ(in.workers(), static_cast<int>(kInline));
  EXPECT_NE(in.describe().find("workers: inline (free)"), std::string::npos) << in.describe();
  EXPECT_EQ(in.fingerprint(), p.fingerprint());  // free: not part of what the batches are
  Loader li(in, {.epochs = 1});
  Loader la(p, {.epochs = 1});
  EXPECT_EQ(digests(li), digests(la));
  EXPECT_TRUE(li.stats().workers_inline);
  EXPECT_FALSE(li.stats().workers_auto);
}

}  // namespace
}  // namespace flowstate
