// Changing a mix's data mid-run (issue 25): new weights, inputs added or removed on a resume
// that opts in (LoaderOptions::on_data_change), and weights set while running
// (Loader::set_mix_weights). Each rule is checked against an oracle built here: each input's
// own order (from an uninterrupted run) and the mix's draw (Philox over the weights, keyed as
// the mix's) from the positions the state had — a fresh pipeline of the new configuration
// fast-forwarded to those positions — and by counting records: within the epoch none is
// delivered twice and none of a kept input is lost.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "flowstate/config/inspect.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/rng.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/tools/testing.h"
#include "flowstate/tools/verify.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::record_index;
using testing::TempDir;
using Item = std::pair<int, std::uint64_t>;  // (input tag, record)

using testing::checkpoint_error;

class MixChangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    files_[0] = testing::write_records(dir_ / "a", 40, 16, 2);
    files_[1] = testing::write_records(dir_ / "b", 120, 16, 3);
    files_[2] = testing::write_records(dir_ / "c", 60, 16, 2);
  }
  /// Input `tag` (0: a, 1: b, 2: c), shuffled; every sample gets field "from" = tag.
  Pipeline input(int tag) const {
    const auto t = static_cast<std::uint8_t>(tag);
    return Pipeline::Builder()
        .seed(tag)
        .records({.paths = {files_.at(tag)}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .map(
            [t](Sample& s, MapContext&) {
              Tensor x(DType::kUInt8, Shape{});
              x.values<std::uint8_t>()[0] = t;
              s.set("from", x);
            },
            {.name = "tag" + std::to_string(tag)})
        .build_input();
  }
  Pipeline mixed(const std::vector<int>& tags, std::vector<double> w,
                 MixStop stop = MixStop::kAllExhausted, std::size_t batch = 4,
                 std::uint64_t seed = 77) const {
    std::vector<Pipeline> inputs;
    for (int t : tags) inputs.push_back(input(t));
    return Pipeline::Builder()
        .seed(seed)
        .mix(std::move(inputs), {.weights = std::move(w), .stop = stop})
        .batch({.size = batch})
        .build();
  }
  static std::vector<Item> items(const Batch& b) {
    std::vector<Item> out;
    const Tensor& d = b["data"];
    auto from = b["from"].values<std::uint8_t>();
    for (std::int64_t i = 0; i < d.shape()[0]; ++i)
      out.emplace_back(from[i], record_index(static_cast<const std::byte*>(d.data()) + i * 16));
    return out;
  }
  /// Every item of the rest of the epoch.
  static std::vector<Item> rest_of_epoch(Loader& l) {
    std::vector<Item> out;
    while (auto b = l.next()) {
      for (auto it : items(*b)) out.push_back(it);
      if (b->info.is_last_in_epoch) break;
    }
    return out;
  }
  static std::vector<Item> take(Loader& l, std::size_t batches) {
    std::vector<Item> out;
    for (std::size_t k = 0; k < batches; ++k) {
      auto b = l.next();
      EXPECT_TRUE(b);
      for (auto it : items(*b)) out.push_back(it);
    }
    return out;
  }
  /// Input `tag`'s own order in an epoch: its items in an uninterrupted all_exhausted run.
  std::vector<std::uint64_t> order_of(int tag) const {
    Loader l(mixed({tag, tag == 0 ? 1 : 0}, {1, 1}), {.epochs = 1});
    std::vector<std::uint64_t> out;
    for (auto [t, r] : rest_of_epoch(l))
      if (t == tag) out.push_back(r);
    return out;
  }
  /// The mix's own state (draws, each input's taken) through `flowstate inspect`'s decoding.
  static nlohmann::json mix_state(const Loader& l) {
    const PipelineState s = l.state_struct();
    return nlohmann::json::parse(describe_node_states(s.spine, s.canonical, "state"))[0]["state"];
  }
  /// The oracle: what a fresh mix of inputs `tags` (weights `w`, all_exhausted, seed 77) gives
  /// from draw `draws` on with input k at position taken[k], by the documented draw.
  std::vector<Item> expected(const std::vector<int>& tags, const std::vector<double>& w,
                             std::uint64_t draws, std::vector<std::uint64_t> taken) const {
    const std::uint64_t key = hash_combine(hash_combine(77, 0), hash64("mix"));
    std::vector<std::vector<std::uint64_t>> order;
    for (int t : tags) order.push_back(order_of(t));
    std::vector<char> out_of_draw(tags.size(), 0);
    std::vector<Item> out;
    for (;;) {
      double total = 0;
      for (std::size_t i = 0; i < tags.size(); ++i) total += out_of_draw[i] ? 0 : w[i];
      if (total == 0) return out;
      const double u = static_cast<double>(philox64(key, 0, draws++) >> 11) * 0x1p-53 * total;
      double acc = 0;
      std::size_t pick = 0;
      for (std::size_t i = 0; i < tags.size(); ++i) {
        if (out_of_draw[i]) continue;
        acc += w[i];
        pick = i;
        if (u < acc) break;
      }
      if (taken[pick] == order[pick].size()) {
        out_of_draw[pick] = 1;
        continue;
      }
      out.emplace_back(tags[pick], order[pick][taken[pick]++]);
    }
  }
  /// Each record of an epoch once: no input's record twice, and every record of `complete`.
  void expect_exactly_once(const std::vector<Item>& all, const std::set<int>& complete) const {
    std::map<int, std::set<std::uint64_t>> seen;
    for (auto [t, r] : all) EXPECT_TRUE(seen[t].insert(r).second) << t << ":" << r << " twice";
    const std::map<int, std::size_t> sizes{{0, 40}, {1, 120}, {2, 60}};
    for (int t : complete) EXPECT_EQ(seen[t].size(), sizes.at(t)) << "input tag " << t;
  }

  TempDir dir_;
  std::map<int, std::string> files_;
};

TEST_F(MixChangeTest, WithoutTheOptInAChangeIsRefusedAsBefore) {
  Loader a(mixed({0, 1}, {1, 1}));
  take(a, 5);
  Loader b(mixed({0, 1}, {3, 1}));
  const std::string what = checkpoint_error([&] { b.load_state(a.state()); });
  EXPECT_NE(what.find("mix.weights: [1, 1] in checkpoint, [3, 1] now"), std::string::npos) << what;
  EXPECT_NE(what.find("--data-changed continue"), std::string::npos) << what;
}

TEST_F(MixChangeTest, NewWeightsApplyFromTheResumeStepAndEveryInputKeepsItsPosition) {
  Loader a(mixed({0, 1}, {1, 1}));
  const std::vector<Item> before = take(a, 6);
  const nlohmann::json at = mix_state(a);
  Loader b(mixed({0, 1}, {1, 5}), {.on_data_change = OnDataChange::kContinue});
  b.load_state(a.state());
  const std::vector<Item> after = rest_of_epoch(b);
  // Positions as the provenance counts them, and as the state holds them.
  std::vector<std::uint64_t> taken{0, 0};
  for (auto [t, r] : before) ++taken[static_cast<std::size_t>(t)];
  EXPECT_EQ(at["inputs"][0]["taken"], taken[0]);
  EXPECT_EQ(at["inputs"][1]["taken"], taken[1]);
  EXPECT_EQ(after, expected({0, 1}, {1, 5}, at["draws"].get<std::uint64_t>(), taken));
  std::vector<Item> all = before;
  all.insert(all.end(), after.begin(), after.end());
  expect_exactly_once(all, {0, 1});
  ASSERT_EQ(b.data_changes().size(), 1u);
  EXPECT_EQ(b.data_changes()[0].step, 6u);
  EXPECT_EQ(b.data_changes()[0].what, "mix.weights: [1, 1] in checkpoint, [1, 5] now");
}

TEST_F(MixChangeTest, AnAddedInputStartsAtItsBeginningAtTheResumeStep) {
  Loader a(mixed({0, 1}, {1, 1}));
  const std::vector<Item> before = take(a, 5);
  const nlohmann::json at = mix_state(a);
  Loader b(mixed({0, 1, 2}, {1, 1, 2}), {.on_data_change = OnDataChange::kContinue});
  b.load_state(a.state());
  const std::vector<Item> after = rest_of_epoch(b);
  std::vector<std::uint64_t> taken{0, 0, 0};
  for (auto [t, r] : before) ++taken[static_cast<std::size_t>(t)];
  EXPECT_EQ(after, expected({0, 1, 2}, {1, 1, 2}, at["draws"].get<std::uint64_t>(), taken));
  std::vector<Item> all = before;
  all.insert(all.end(), after.begin(), after.end());
  expect_exactly_once(all, {0, 1, 2});
  ASSERT_EQ(b.data_changes().size(), 1u);
  EXPECT_NE(b.data_changes()[0].what.find("mix: input 2 added, from its beginning"),
            std::string::npos)
      << b.data_changes()[0].what;
}

TEST_F(MixChangeTest, ARemovedInputsStateIsDroppedAndTheOthersKeepTheirPositions) {
  Loader a(mixed({0, 1, 2}, {1, 1, 1}));
  const std::vector<Item> before = take(a, 5);
  const nlohmann::json at = mix_state(a);
  Loader b(mixed({0, 2}, {1, 1}), {.on_data_change = OnDataChange::kContinue});
  b.load_state(a.state());
  const std::vector<Item> after = rest_of_epoch(b);
  std::vector<std::uint64_t> taken(3, 0);
  for (auto [t, r] : before) ++taken[static_cast<std::size_t>(t)];
  ASSERT_GT(taken[1], 0u);
  EXPECT_EQ(after,
            expected({0, 2}, {1, 1}, at["draws"].get<std::uint64_t>(), {taken[0], taken[2]}));
  for (auto [t, r] : after) EXPECT_NE(t, 1);
  std::vector<Item> all = before;
  all.insert(all.end(), after.begin(), after.end());
  expect_exactly_once(all, {0, 2});
  ASSERT_EQ(b.data_changes().size(), 1u);
  const std::string& what = b.data_changes()[0].what;
  EXPECT_NE(what.find("mix: input 1 removed after " + std::to_string(taken[1]) + " samples"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("mix: input 2 is now input 1"), std::string::npos) << what;
}

TEST_F(MixChangeTest, WhatCannotContinueExactlyIsStillRefusedByName) {
  Loader a(mixed({0, 1}, {1, 1}));
  take(a, 3);
  const std::string state = a.state();
  const LoaderOptions opt_in{.on_data_change = OnDataChange::kContinue};
  struct Case {
    Pipeline p;
    std::string names;
  };
  std::vector<Case> cases;
  cases.push_back(
      {mixed({0, 1}, {1, 2}, MixStop::kAllExhausted, 8), "batch.size: 4 in checkpoint, 8 now"});
  cases.push_back(
      {mixed({0, 1}, {1, 1}, MixStop::kCycle), "mix.stop: all_exhausted in checkpoint"});
  cases.push_back(
      {mixed({0, 1}, {1, 2}, MixStop::kAllExhausted, 4, 78), "seed: 77 in checkpoint, 78 now"});
  for (auto& c : cases) {
    Loader b(c.p, opt_in);
    const std::string what = checkpoint_error([&] { b.load_state(state); });
    EXPECT_NE(what.find("only data parameters may change: mix.weights, mix.inputs"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find(c.names), std::string::npos) << what;
    EXPECT_EQ(what.find("mix.weights:"), std::string::npos) << what;  // only what blocks it
  }
  // pack holds Refs of the mix's inputs by number: inputs may be appended, not removed.
  auto packed = [&](const std::vector<int>& tags, std::vector<double> w) {
    std::vector<Pipeline> inputs;
    for (int t : tags) inputs.push_back(input(t));
    return Pipeline::Builder()
        .seed(77)
        .mix(std::move(inputs), {.weights = std::move(w), .stop = MixStop::kAllExhausted})
        .pack({.length = 40, .field = "data"})
        .batch({.size = 2})
        .build();
  };
  Loader p(packed({0, 1, 2}, {1, 1, 1}));
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(p.next());
  Loader removed(packed({0, 2}, {1, 1}), opt_in);
  EXPECT_NE(checkpoint_error([&] {
              removed.load_state(p.state());
            }).find("'pack' after it holds Refs of its inputs by number"),
            std::string::npos);
  Loader last_removed(packed({0, 1}, {1, 1}), opt_in);
  EXPECT_NE(checkpoint_error([&] {
              last_removed.load_state(p.state());
            }).find("input 2 is not the checkpoint's"),
            std::string::npos);
  Loader reweighted(packed({0, 1, 2}, {1, 2, 3}), opt_in);
  EXPECT_NO_THROW(reweighted.load_state(p.state()));
  Loader appended(packed({0, 1, 2, 0}, {1, 2, 3, 1}), opt_in);
  EXPECT_NO_THROW(appended.load_state(p.state()));
}

TEST_F(MixChangeTest, WeightsSetWhileRunningArePartOfTheStateAndResumeExactly) {
  // set_mix_weights at steps 10 and 25; a copy resumed at 30 from the state gives the bytes of
  // the uninterrupted run, and so does one resumed at 20 (between the two).
  auto make = [&] { return mixed({0, 1, 2}, {1, 1, 1}, MixStop::kAllExhausted, 4); };
  auto run = [&](Loader& l, std::uint64_t from, std::uint64_t to) {
    std::vector<std::uint64_t> digests;
    for (std::uint64_t step = from; step < to; ++step) {
      if (step == 10) l.set_mix_weights("mix", {5, 1, 1});
      if (step == 25) l.set_mix_weights("mix", {1, 1, 6});
      auto b = l.next();
      if (!b) break;
      EXPECT_EQ(b->info.step, step);
      digests.push_back(b->digest());
    }
    return digests;
  };
  Loader whole(make());
  const std::vector<std::uint64_t> all = run(whole, 0, 55);
  ASSERT_EQ(whole.data_changes().size(), 2u);
  EXPECT_EQ(whole.data_changes()[0].step, 10u);
  EXPECT_EQ(whole.data_changes()[0].what,
            "mix: weights [1, 1, 1] -> [5, 1, 1] (set while running)");
  EXPECT_EQ(whole.data_changes()[1].step, 25u);
  for (std::uint64_t cut : {20u, 30u}) {
    Loader first(make());
    std::vector<std::uint64_t> got = run(first, 0, cut);
    Loader second(make());
    second.load_state(first.state());  // the same configuration: no opt-in needed
    EXPECT_EQ(second.data_changes(), first.data_changes());
    auto rest = run(second, cut, 55);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, all) << "resumed at " << cut;
  }
  // The same weights again change nothing and record nothing.
  Loader l(make());
  run(l, 0, 12);
  l.set_mix_weights("mix", {5, 1, 1});
  EXPECT_EQ(l.data_changes().size(), 1u);
}

TEST_F(MixChangeTest, SetMixWeightsRefusesWhatDoesNotFit) {
  Loader l(mixed({0, 1}, {1, 1}));
  take(l, 2);
  EXPECT_THROW(
      {
        try {
          l.set_mix_weights("mux", {1, 1});
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("'mux' is not a mix node"), std::string::npos);
          throw;
        }
      },
      ConfigError);
  EXPECT_THROW(l.set_mix_weights("mix", {1, 1, 1}), ConfigError);
  EXPECT_THROW(l.set_mix_weights("mix", {1, -1}), ConfigError);
  // The loader goes on as before.
  auto b = l.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->info.step, 2u);
}

TEST_F(MixChangeTest, TheHistoryTravelsWithTheStateAndAChangedResumeAddsToIt) {
  Loader a(mixed({0, 1}, {1, 1}));
  take(a, 3);
  a.set_mix_weights("mix", {2, 1});
  take(a, 3);
  Loader b(mixed({0, 1, 2}, {1, 1, 1}), {.on_data_change = OnDataChange::kContinue});
  b.load_state(a.state());
  ASSERT_EQ(b.data_changes().size(), 2u);
  EXPECT_EQ(b.data_changes()[0].step, 3u);
  EXPECT_EQ(b.data_changes()[1].step, 6u);
  const std::string& what = b.data_changes()[1].what;
  EXPECT_NE(what.find("the weights set while running, [2, 1], give way to the configuration's "
                      "[1, 1, 1]"),
            std::string::npos)
      << what;
  // The encoded state keeps it (format version 2); a state without changes is version 1.
  const PipelineState s = PipelineState::decode(b.state());
  EXPECT_EQ(s.format_version, 2u);
  EXPECT_EQ(s.data_changes, b.data_changes());
  Loader plain(mixed({0, 1}, {1, 1}));
  EXPECT_EQ(PipelineState::decode(plain.state()).format_version, 1u);
}

TEST_F(MixChangeTest, TheOracleAndVerifyCoverWeightsSetWhileRunning) {
  auto make = [&] { return mixed({0, 1, 2}, {1, 1, 1}, MixStop::kCycle, 4); };
  const std::vector<MixWeightsAt> weights{{.step = 7, .node = "mix", .weights = {5, 1, 1}},
                                          {.step = 40, .node = "mix", .weights = {1, 1, 6}}};
  const auto check = [&](const testing::OracleReport& r) {
    EXPECT_TRUE(r.ok()) << r.summary();
    EXPECT_GT(r.batches, 40u);
  };
  check(testing::check_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2},
                                    weights));
  const VerifyReport v =
      verify(make(), {.steps = 80, .trials = 6, .epochs = 2, .mix_weights = weights});
  EXPECT_TRUE(v.ok()) << v.summary();
  // The weights changed the batches: without them the reference differs from step 7 on.
  const VerifyReport plain = verify(make(), {.steps = 80, .trials = 1, .epochs = 2});
  EXPECT_EQ(std::vector<VerifyBatch>(plain.reference.begin(), plain.reference.begin() + 7),
            std::vector<VerifyBatch>(v.reference.begin(), v.reference.begin() + 7));
  EXPECT_NE(plain.reference, v.reference);
}

}  // namespace
}  // namespace flowstate
