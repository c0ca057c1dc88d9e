// flowstate::verify on pipelines built in C++: a from_range source with lambda maps resumes
// exactly and passes; a map whose output depends on a process-wide counter (different on
// every run) is caught; bad options are ConfigErrors with their exact text.
#include "flowstate/tools/verify.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/iterable.h"

namespace flowstate {
namespace {

/// Copies the collated int values (a Tensor [B]) into field "value", so Batch::digest — and
/// with it verify — covers them.
void expose_values(Batch& b, MapContext&) { b.fields.set("value", batch_value<int>(b)); }

std::vector<int> iota_values(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// 100 ints, shuffled, mapped by a lambda that draws from the map's RNG, in batches of 8:
/// 13 batches an epoch, the last one short.
Pipeline deterministic_pipeline(const std::vector<int>& values) {
  return Pipeline::Builder()
      .seed(5)
      .workers(2)
      .source(from_range(values, {.name = "ints"}))
      .shuffle({})
      .map(map_value<int>(
               [](int& v, MapContext& ctx) { v = v * 3 + static_cast<int>(ctx.rng.below(7)); }),
           {.name = "scale"})
      .batch({.size = 8})
      .map_batch(expose_values, {.name = "expose"})
      .build();
}

/// Incremented by every call of the map below, across Loaders: a run never sees the values
/// an earlier run saw.
std::atomic<int> g_calls{0};

TEST(Verify, PassesOnAFromRangePipelineWithLambdaMaps) {
  const std::vector<int> values = iota_values(100);
  const Pipeline p = deterministic_pipeline(values);
  std::vector<std::string> lines;
  const VerifyReport r = verify(
      p,
      {.steps = 30, .trials = 5, .seed = 3, .epochs = 3, .progress = [&](const std::string& line) {
         lines.push_back(line);
       }});

  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_TRUE(r.mismatches.empty());
  ASSERT_EQ(r.reference.size(), 30u);
  EXPECT_FALSE(r.pipeline_ended);
  EXPECT_EQ(r.reference.front().step, 0u);
  EXPECT_EQ(r.reference[12].epoch, 0u);
  EXPECT_TRUE(r.reference[12].is_last_in_epoch);
  EXPECT_EQ(r.reference[13].epoch, 1u);
  EXPECT_EQ(r.reference[13].index_in_epoch, 0u);

  ASSERT_EQ(r.trials.size(), 5u);
  const int workers[] = {1, 3, 2, static_cast<int>(kInline), 1};
  for (std::size_t i = 0; i < r.trials.size(); ++i) {
    const VerifyTrial& t = r.trials[i];
    EXPECT_EQ(t.number, static_cast<int>(i) + 1);
    EXPECT_EQ(t.workers, workers[i]);
    EXPECT_EQ(t.mismatches, 0u);
    EXPECT_EQ(t.compared, 30u - t.restored_after);
    EXPECT_EQ(t.checkpoint.rfind("step-", 0), 0u) << t.checkpoint;
    if (i > 0) {
      EXPECT_LT(r.trials[i - 1].restored_after, t.restored_after);
    }
  }

  // The progress lines are the summary's, in order.
  const std::string summary = r.summary();
  EXPECT_EQ(summary.rfind("reference: 30 batches uninterrupted (steps 0..29)\n", 0), 0u) << summary;
  std::string joined;
  for (const auto& l : lines) joined += l + "\n";
  EXPECT_EQ(joined, summary);
  EXPECT_EQ(lines.size(), 6u);
}

TEST(Verify, ReportsThatThePipelineEndsBeforeTheSteps) {
  const std::vector<int> values = iota_values(100);
  const VerifyReport r = verify(deterministic_pipeline(values), {.steps = 50, .trials = 2});
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_TRUE(r.pipeline_ended);
  ASSERT_EQ(r.reference.size(), 13u);  // one epoch by default
  EXPECT_TRUE(r.reference.back().is_last_in_epoch);
  EXPECT_EQ(r.summary().rfind("reference: 13 batches uninterrupted (steps 0..12) (the pipeline "
                              "ends there)\n",
                              0),
            0u)
      << r.summary();
}

TEST(Verify, CatchesAMapThatDependsOnAGlobalCounter) {
  const std::vector<int> values = iota_values(64);
  const Pipeline p =
      Pipeline::Builder()
          .workers(1)
          .source(from_range(values, {.name = "ints"}))
          .map(map_value<int>([](int& v) { v += g_calls.fetch_add(1); }), {.name = "count"})
          .batch({.size = 4})
          .map_batch(expose_values, {.name = "expose"})
          .build();
  const VerifyReport r = verify(p, {.steps = 12, .trials = 3, .seed = 7});

  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.mismatches.empty());
  ASSERT_EQ(r.trials.size(), 3u);
  // Every batch the counter touched differs: BatchInfo matches, the digest does not.
  std::uint64_t in_trials = 0;
  for (const VerifyTrial& t : r.trials) {
    EXPECT_EQ(t.mismatches, t.compared) << t.describe();
    in_trials += t.mismatches;
  }
  EXPECT_GT(in_trials, 0u);
  for (const VerifyMismatch& m : r.mismatches) {
    ASSERT_TRUE(m.got.has_value());
    EXPECT_EQ(m.got->step, m.expected.step);
    EXPECT_EQ(m.got->epoch, m.expected.epoch);
    EXPECT_EQ(m.got->index_in_epoch, m.expected.index_in_epoch);
    EXPECT_NE(m.got->digest, m.expected.digest);
    EXPECT_EQ(m.expected.step, m.batch);
  }
  // The run that writes the checkpoints repeats the reference up to the last restore point;
  // it differs too.
  const std::uint64_t rerun = r.trials.back().restored_after;
  std::uint64_t rerun_mismatches = 0;
  for (const VerifyMismatch& m : r.mismatches) rerun_mismatches += m.trial == 0 ? 1 : 0;
  EXPECT_EQ(rerun_mismatches, rerun);
  EXPECT_EQ(r.mismatches.size(), rerun_mismatches + in_trials);

  const VerifyMismatch& first_in_trial = r.mismatches[rerun_mismatches];
  EXPECT_EQ(first_in_trial.describe().rfind(
                "trial 1: batch " + std::to_string(first_in_trial.batch) + ": step ", 0),
            0u)
      << first_in_trial.describe();
  EXPECT_NE(r.summary().find(" mismatches\n"), std::string::npos) << r.summary();
}

TEST(Verify, DescribesAMissingBatch) {
  VerifyMismatch m{.trial = 2,
                   .batch = 4,
                   .expected = {.step = 4, .epoch = 1, .index_in_epoch = 0, .digest = 0xab}};
  EXPECT_EQ(m.describe(),
            "trial 2: batch 4: the restored run ended, expected step 4 epoch 1 index 0 digest "
            "00000000000000ab");
  m.trial = 0;
  m.got = VerifyBatch{.step = 4, .epoch = 1, .is_last_in_epoch = true, .digest = 1};
  EXPECT_EQ(m.describe(),
            "rerun: batch 4: step 4 epoch 1 index 0 (last in epoch) digest 0000000000000001, "
            "expected step 4 epoch 1 index 0 digest 00000000000000ab");
}

TEST(Verify, RejectsOptionsThatMakeNoSense) {
  const std::vector<int> values = iota_values(16);
  const Pipeline p = deterministic_pipeline(values);
  auto message = [&](const VerifyOptions& o) {
    try {
      verify(p, o);
    } catch (const ConfigError& e) {
      return e.key() + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({}), "steps: steps must be at least 1");
  EXPECT_EQ(message({.steps = 4, .trials = 0}), "trials: trials must be at least 1");
  EXPECT_EQ(message({.steps = 4, .workers = -2}),
            "workers: workers must be at least 1, auto (0) or inline (-1)");
  EXPECT_EQ(message({.steps = 4, .restore_workers = {}}),
            "restore_workers: restore_workers needs at least one worker count");
  EXPECT_EQ(message({.steps = 4, .restore_workers = {2, 0}}),
            "restore_workers: every restore_workers count must be >= 1 or inline (-1)");
}

}  // namespace
}  // namespace flowstate
