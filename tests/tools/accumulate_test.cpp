// GradientAccumulator: windows, forced steps at epoch ends, sample-weighted scaling, and the
// same windows after a resume mid-window.
#include "flowstate/tools/accumulate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/iterable.h"

namespace flowstate {
namespace {

/// The BatchInfos of epochs of `samples` samples in batches of `batch` (the last one short).
std::vector<BatchInfo> schedule(std::uint64_t samples, std::uint32_t batch, int epochs) {
  std::vector<BatchInfo> out;
  const std::uint64_t n = (samples + batch - 1) / batch;
  std::uint64_t step = 0;
  for (int e = 0; e < epochs; ++e)
    for (std::uint64_t i = 0; i < n; ++i) {
      BatchInfo info;
      info.step = step++;
      info.epoch = static_cast<std::uint64_t>(e);
      info.index_in_epoch = i;
      info.batches_in_epoch = n;
      info.is_last_in_epoch = i + 1 == n;
      const std::uint64_t left = samples - i * batch;
      info.num_samples = static_cast<std::uint32_t>(std::min<std::uint64_t>(batch, left));
      info.remainder = info.num_samples < batch ? info.num_samples : 0;
      out.push_back(info);
    }
  return out;
}

/// One optimizer step of a trainer following the accumulator: the epoch and steps of its
/// batches, their samples, and the total weight of those samples in the step's gradient (a
/// mean loss scaled by loss_scale gives each of its samples loss_scale / num_samples; the
/// step multiplies everything by step_scale). 1 means the gradient is the window's mean.
struct Window {
  std::uint64_t epoch;
  std::vector<std::uint64_t> steps;
  std::uint64_t samples = 0;
  double weight = 0;
  bool operator==(const Window& o) const {
    return epoch == o.epoch && steps == o.steps && samples == o.samples &&
           std::abs(weight - o.weight) < 1e-12;
  }
};

std::vector<Window> run(const GradientAccumulator& acc, const std::vector<BatchInfo>& infos) {
  std::vector<Window> out;
  Window open{};
  bool has_open = false;
  for (const BatchInfo& info : infos) {
    if (!has_open) {
      open = Window{info.epoch, {}, 0, 0};
      has_open = true;
    }
    EXPECT_EQ(open.epoch, info.epoch) << "a window crossed an epoch boundary";
    open.steps.push_back(info.step);
    open.samples += info.num_samples;
    open.weight += acc.loss_scale(info);
    if (acc.step_after(info)) {
      EXPECT_EQ(acc.window_samples(info), open.samples);
      open.weight *= acc.step_scale(info);
      out.push_back(open);
      has_open = false;
    }
  }
  EXPECT_FALSE(has_open) << "the last window was never stepped";
  return out;
}

TEST(GradientAccumulator, RejectsZeroMicroBatchesAndBatchSize) {
  try {
    GradientAccumulator(0, 8);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "accumulate.micro_batches");
    EXPECT_EQ(std::string(e.what()), "micro_batches must be greater than zero");
  }
  try {
    GradientAccumulator(2, 0);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "accumulate.batch_size");
    EXPECT_EQ(std::string(e.what()), "batch_size must be greater than zero");
  }
}

TEST(GradientAccumulator, StepsEveryNBatchesAndAtEachEpochsEnd) {
  GradientAccumulator acc(4, 8);
  // 10 batches per epoch (the last of 3 samples): windows 4 + 4 + 2.
  auto windows = run(acc, schedule(75, 8, 2));
  ASSERT_EQ(windows.size(), 6u);
  EXPECT_THAT(windows[0].steps, ::testing::ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(windows[1].steps, ::testing::ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(windows[2].steps, ::testing::ElementsAre(8, 9));            // the short last window
  EXPECT_THAT(windows[3].steps, ::testing::ElementsAre(10, 11, 12, 13));  // not mixed in
  EXPECT_EQ(windows[2].samples, 8u + 3u);
  EXPECT_EQ(windows[3].epoch, 1u);
  // Every window's samples weigh 1 in total: the gradient is the mean over its samples.
  for (const Window& w : windows) EXPECT_NEAR(w.weight, 1.0, 1e-12);
}

TEST(GradientAccumulator, FullWindowsNeedNoStepScale) {
  GradientAccumulator acc(3, 16);
  for (const BatchInfo& info : schedule(96, 16, 1)) {
    EXPECT_DOUBLE_EQ(acc.loss_scale(info), 1.0 / 3);
    if (acc.step_after(info)) {
      EXPECT_DOUBLE_EQ(acc.step_scale(info), 1.0);
    }
  }
}

TEST(GradientAccumulator, ShortLastBatchIsWeightedBySamples) {
  GradientAccumulator acc(2, 10);
  auto infos = schedule(25, 10, 1);  // 10, 10, 5: windows {10, 10} and {5}
  ASSERT_EQ(infos.size(), 3u);
  EXPECT_DOUBLE_EQ(acc.loss_scale(infos[2]), 5.0 / 20);
  EXPECT_TRUE(acc.step_after(infos[2]));
  EXPECT_EQ(acc.window_samples(infos[2]), 5u);
  EXPECT_DOUBLE_EQ(acc.step_scale(infos[2]), 20.0 / 5);
  // A window of one full batch and a short one: 10 + 5 samples.
  GradientAccumulator three(3, 10);
  auto more = schedule(45, 10, 1);  // 10, 10, 10 | 10, 5
  EXPECT_TRUE(three.step_after(more[4]));
  EXPECT_EQ(three.window_samples(more[4]), 15u);
  EXPECT_DOUBLE_EQ(three.step_scale(more[4]), 30.0 / 15);
}

TEST(GradientAccumulator, OneMicroBatchStepsEveryBatch) {
  GradientAccumulator acc(1, 4);
  auto windows = run(acc, schedule(10, 4, 1));
  ASSERT_EQ(windows.size(), 3u);
  for (const Window& w : windows) EXPECT_NEAR(w.weight, 1.0, 1e-12);
}

TEST(GradientAccumulator, WindowLargerThanTheEpochStepsAtItsEnd) {
  GradientAccumulator acc(8, 4);
  auto windows = run(acc, schedule(10, 4, 2));  // 3 batches per epoch
  ASSERT_EQ(windows.size(), 2u);
  EXPECT_THAT(windows[0].steps, ::testing::ElementsAre(0, 1, 2));
  EXPECT_THAT(windows[1].steps, ::testing::ElementsAre(3, 4, 5));
}

TEST(GradientAccumulator, WindowPositionsComeFromTheEpochIndex) {
  GradientAccumulator acc(4, 8);
  BatchInfo info;
  info.index_in_epoch = 6;
  info.num_samples = 8;
  info.step = 1000;  // the global step does not matter
  EXPECT_EQ(acc.window(info), 1u);
  EXPECT_EQ(acc.position(info), 2u);
  EXPECT_FALSE(acc.starts_window(info));
  EXPECT_FALSE(acc.step_after(info));
  info.index_in_epoch = 7;
  EXPECT_TRUE(acc.step_after(info));
  info.index_in_epoch = 8;
  EXPECT_TRUE(acc.starts_window(info));
}

TEST(GradientAccumulator, OversizedBatchIsAnError) {
  GradientAccumulator acc(2, 8);
  BatchInfo info;
  info.step = 3;
  info.num_samples = 9;
  try {
    acc.loss_scale(info);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "batch 3 holds 9 samples, more than the GradientAccumulator's batch_size 8");
  }
}

/// The (step, step_after, loss_scale, step_scale) a trainer sees for each batch.
struct Seen {
  std::uint64_t step;
  bool step_after;
  double loss_scale, step_scale;
  bool operator==(const Seen&) const = default;
};

std::vector<Seen> follow(Loader& loader, const GradientAccumulator& acc, std::size_t limit) {
  std::vector<Seen> out;
  while (out.size() < limit) {
    auto b = loader.next();
    if (!b) break;
    out.push_back(
        {b->info.step, acc.step_after(b->info), acc.loss_scale(b->info), acc.step_scale(b->info)});
  }
  return out;
}

TEST(GradientAccumulator, ResumeMidWindowKeepsTheWindowsOfTheUninterruptedRun) {
  // 43 values in batches of 4: 11 batches per epoch, windows of 3 → 3 + 3 + 3 + 2.
  std::vector<int> values(43);
  std::iota(values.begin(), values.end(), 0);
  auto make = [&] {
    return Pipeline::Builder()
        .source(from_range(values, {.name = "values"}))
        .shuffle({})
        .batch({.size = 4})
        .build();
  };
  GradientAccumulator acc(3, 4);
  std::vector<Seen> full;
  {
    Loader l(make(), {.epochs = 2});
    full = follow(l, acc, SIZE_MAX);
  }
  ASSERT_EQ(full.size(), 22u);
  EXPECT_TRUE(full[10].step_after);  // the epoch's end closes the short window
  EXPECT_DOUBLE_EQ(full[10].step_scale, 12.0 / 7);
  for (std::size_t k : {1u, 4u, 10u, 13u}) {  // mid-window breakpoints, and across the epoch
    SCOPED_TRACE("resume after " + std::to_string(k) + " batches");
    std::string state;
    std::vector<Seen> got;
    {
      Loader l(make(), {.epochs = 2});
      got = follow(l, acc, k);
      state = l.state();
    }
    Loader resumed(make(), {.epochs = 2});
    resumed.load_state(state);
    auto rest = follow(resumed, GradientAccumulator(3, 4), SIZE_MAX);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, full);
  }
}

TEST(GradientAccumulator, UnknownLengthEpochsStillStepAtTheirEnd) {
  struct Counter {
    int i = 0, n = 0;
    std::optional<int> next() { return i < n ? std::optional<int>(i++) : std::nullopt; }
    std::string save() const { return std::to_string(i); }
    void load(std::string_view s) { i = std::stoi(std::string(s)); }
  };
  Loader l(Pipeline::Builder()
               .source(from_producer(
                   [](std::uint64_t) {
                     return Counter{0, 18};
                   },
                   {.name = "counter"}))
               .batch({.size = 4})
               .build(),
           {.epochs = 2});
  GradientAccumulator acc(2, 4);
  std::vector<BatchInfo> infos;
  while (auto b = l.next()) infos.push_back(b->info);
  auto windows = run(acc, infos);  // 5 batches per epoch (4,4,4,4,2): windows 2 + 2 + 1
  ASSERT_EQ(windows.size(), 6u);
  EXPECT_THAT(windows[2].steps, ::testing::ElementsAre(4));
  EXPECT_EQ(windows[2].samples, 2u);
  for (const Window& w : windows) EXPECT_NEAR(w.weight, 1.0, 1e-12);
}

}  // namespace
}  // namespace flowstate
