// Seeing where the time goes: per-node counters (Loader::stats), the trace file
// (LoaderOptions::trace) and the metrics lines (LoaderOptions::metrics, on_metrics). The trace
// and metrics formats are checked by parsing them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "flowstate/graph/loader.h"
#include "flowstate/graph/metrics.h"
#include "flowstate/graph/trace.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/mix.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

class Observe : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 2000, 64, 2); }
  /// records -> shuffle -> map:augment (slow) -> filter-free -> batch
  Pipeline pipeline(std::chrono::microseconds map_cost = std::chrono::microseconds(20)) const {
    return Pipeline::Builder()
        .seed(5)
        .workers(2)
        .records({.paths = {glob_}, .record_bytes = 64})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
        .map(
            [map_cost](Sample& s, MapContext&) {
              const auto until = std::chrono::steady_clock::now() + map_cost;
              while (std::chrono::steady_clock::now() < until) {
              }
              Tensor extra(DType::kUInt8, Shape{8});
              std::memset(extra.data(), 7, 8);
              s.set("extra", std::move(extra));
            },
            {.name = "augment"})
        .batch({.size = 32})
        .build();
  }
  TempDir dir_;
  std::string glob_;
};

const LoaderStats::Node* node(const LoaderStats& s, const std::string& name) {
  for (const auto& n : s.nodes)
    if (n.name == name) return &n;
  return nullptr;
}

TEST_F(Observe, StatsCountEveryNodeByName) {
  Loader loader(pipeline(), {.epochs = 1});
  std::uint64_t batches = 0, samples = 0;
  while (auto b = loader.next()) {
    ++batches;
    samples += b->info.num_samples;
  }
  const LoaderStats s = loader.stats();
  std::vector<std::string> names;
  for (const auto& n : s.nodes) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"records", "shuffle", "map:augment", "batch"}));

  const auto* map = node(s, "map:augment");
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(map->stage, "assemble");
  EXPECT_EQ(map->threads, 2);
  EXPECT_EQ(map->calls, batches);
  EXPECT_EQ(map->items, samples);
  EXPECT_EQ(map->bytes, samples * (64 + 8));  // each sample leaves the map with 72 bytes
  // 2000 samples x 20 us of spinning.
  EXPECT_GE(map->busy_ns, 2000u * 20'000u);
  EXPECT_EQ(map->busy_ns, map->assemble_ns);

  const auto* records = node(s, "records");
  ASSERT_NE(records, nullptr);
  EXPECT_EQ(records->items, samples);  // read in the assembly
  EXPECT_EQ(records->bytes, samples * 64);
  EXPECT_GT(records->assemble_ns, 0u);

  const auto* shuffle = node(s, "shuffle");
  ASSERT_NE(shuffle, nullptr);
  EXPECT_EQ(shuffle->stage, "spine");
  EXPECT_EQ(shuffle->items, samples);  // the Refs the planner pulled from it
  EXPECT_GT(shuffle->spine_ns, 0u);

  const auto* batch = node(s, "batch");
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(batch->items, samples);
  EXPECT_GT(batch->spine_ns, 0u);     // planning
  EXPECT_GT(batch->assemble_ns, 0u);  // collating
  EXPECT_GE(batch->wait_input_ns, 0u);
  // The map is the busiest by far.
  for (const auto& n : s.nodes) {
    if (n.name != "map:augment") {
      EXPECT_LT(n.busy_ns, map->busy_ns) << n.name;
    }
  }
  EXPECT_GT(s.elapsed_ns, 0u);
}

TEST_F(Observe, AYamlStyleNodeIsNamedAfterItsType) {
  // A node whose name is its type stays as it is; another gets "type:name".
  Pipeline p = Pipeline::Builder()
                   .records({.paths = {glob_}, .record_bytes = 64})
                   .filter([](const Sample&, MapContext&) { return true; }, {.name = "long_enough"})
                   .batch({.size = 50})
                   .prefetch({.depth = 2})
                   .build();
  Loader loader(p, {.epochs = 1});
  while (loader.next()) {
  }
  std::vector<std::string> names;
  for (const auto& n : loader.stats().nodes) names.push_back(n.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"records", "filter:long_enough", "batch", "prefetch"}));
  EXPECT_EQ(node(loader.stats(), "filter:long_enough")->items, 2000u);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);  // throws on a malformed trace
}

TEST_F(Observe, TraceIsChromeTraceEventJson) {
  const std::string trace = dir_ / "t.json";
  const std::string ckpt = dir_ / "ck";
  {
    LoaderOptions o{.epochs = 1};
    o.trace = trace;
    Loader loader(pipeline(), o);
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(loader.next());
    loader.save_checkpoint_async(ckpt).get();
    while (loader.next()) {
    }
  }
  const nlohmann::json events = read_json(trace);
  ASSERT_TRUE(events.is_array());
  std::map<int, std::string> tracks;
  std::map<std::string, std::set<int>> span_tracks;
  std::set<std::int64_t> map_steps;
  std::size_t counters = 0;
  int pid = -1;
  for (const auto& e : events) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e;
    if (pid == -1) pid = e["pid"].get<int>();
    EXPECT_EQ(e["pid"].get<int>(), pid);
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    if (ph == "X") {
      ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number()) << e;
      EXPECT_GE(e["dur"].get<double>(), 0) << e;
      span_tracks[e["name"]].insert(e["tid"].get<int>());
      if (e["name"] == "map:augment") {
        ASSERT_TRUE(e["args"].contains("step") && e["args"].contains("epoch")) << e;
        map_steps.insert(e["args"]["step"].get<std::int64_t>());
      }
    }
    if (ph == "C") {
      EXPECT_EQ(e["name"], "batches in flight");
      EXPECT_GE(e["args"]["value"].get<double>(), 0);
      ++counters;
    }
  }
  std::set<std::string> names;
  for (const auto& [tid, name] : tracks) names.insert(name);
  for (const char* t : {"spine", "consumer", "checkpoint writer", "worker 0"})
    EXPECT_TRUE(names.count(t)) << t;
  // A span per node per batch, each on its thread's track.
  EXPECT_EQ(map_steps.size(), 63u);  // ceil(2000 / 32)
  for (int tid : span_tracks["map:augment"]) EXPECT_EQ(tracks[tid].rfind("worker ", 0), 0u);
  for (const char* n : {"shuffle", "batch"}) EXPECT_TRUE(span_tracks[n].count(Tracer::kSpine)) << n;
  EXPECT_TRUE(span_tracks["records"].size() >= 1);
  EXPECT_TRUE(span_tracks.count("consumer step"));
  for (const char* n : {"checkpoint encode", "checkpoint write (state + manifest, fsynced)",
                        "checkpoint commit (rename + fsync)"}) {
    ASSERT_TRUE(span_tracks.count(n)) << n;
    EXPECT_TRUE(span_tracks[n].count(Tracer::kCheckpoint)) << n;
  }
  EXPECT_TRUE(span_tracks["checkpoint cut"].count(Tracer::kConsumer));
  EXPECT_GT(counters, 0u);
  EXPECT_EQ(events.back()["args"]["dropped_events"], 0);
}

TEST_F(Observe, TraceKeepsLongNamesAndExactMicroseconds) {
  const std::string path = dir_ / "long.json";
  const std::string name(400, 'n');
  {
    Tracer t(path);
    const auto id = t.intern(name);
    t.span(Tracer::kSpine, id, t.origin_ns() + 1'234'567, t.origin_ns() + 1'234'567 + 89, 7, 1);
  }
  const nlohmann::json events = read_json(path);
  bool found = false;
  for (const auto& e : events) {
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["name"], name);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1234.567);
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.089);
    EXPECT_EQ(e["args"]["step"], 7);
    EXPECT_EQ(e["args"]["epoch"], 1);
    found = true;
  }
  EXPECT_TRUE(found);
}

TEST_F(Observe, TraceMemoryIsBoundedAndDropsAreCounted) {
  const std::string path = dir_ / "small.json";
  {
    Tracer t(path, 64);
    const auto name = t.intern("x");
    for (int i = 0; i < 10000; ++i) t.span(Tracer::kSpine, name, i * 1000, i * 1000 + 10);
  }
  const nlohmann::json events = read_json(path);
  std::size_t spans = 0;
  for (const auto& e : events) spans += e["ph"] == "X";
  const auto dropped = events.back()["args"]["dropped_events"].get<std::size_t>();
  EXPECT_EQ(spans + dropped, 10000u);
}

/// Steps [first, end) of a synthetic run at `steps_per_s` into `t`: per step a spine span, a
/// worker span and a consumer span with the step, a consumer wait without one, and a counter.
void synthetic_steps(Tracer& t, std::int64_t first, std::int64_t end, std::int64_t steps_per_s) {
  const auto spine = t.intern("shuffle"), map = t.intern("map:augment"), take = t.intern("take"),
             wait = t.intern("wait"), flight = t.intern("batches in flight");
  const std::int64_t dt = 1'000'000'000 / steps_per_s;
  for (std::int64_t step = first; step < end; ++step) {
    const std::int64_t ts = t.origin_ns() + step * dt;
    Tracer::Event e[5];
    e[0] = {.ts_ns = ts,
            .dur_ns = dt / 4,
            .step = step,
            .epoch = 0,
            .track = Tracer::kSpine,
            .name = spine};
    e[1] = {.ts_ns = ts + dt / 4,
            .dur_ns = dt / 2,
            .step = step,
            .epoch = 0,
            .track = Tracer::kWorker0,
            .name = map};
    e[2] = {.ts_ns = ts + dt / 2,
            .dur_ns = dt / 8,
            .step = step,
            .epoch = 0,
            .track = Tracer::kConsumer,
            .name = take};
    e[3] = {.ts_ns = ts + dt / 2, .dur_ns = dt / 8, .track = Tracer::kConsumer, .name = wait};
    e[4] = {.ts_ns = ts, .value = 3, .name = flight, .ph = 'C'};
    t.add(e, 5);
  }
}

/// `seconds` of a synthetic run at `steps_per_s` into `t`.
void synthetic_run(Tracer& t, std::int64_t seconds, std::int64_t steps_per_s) {
  synthetic_steps(t, 0, seconds * steps_per_s, steps_per_s);
}

TEST_F(Observe, ShortTraceKeepsEveryEvent) {
  const std::string path = dir_ / "short.json";
  {
    Tracer t(path, 1 << 20);
    synthetic_run(t, 8, 500);
  }
  const nlohmann::json events = read_json(path);
  std::size_t kept = 0;
  for (const auto& e : events) kept += e["ph"] == "X" || e["ph"] == "C";
  EXPECT_EQ(kept, 8u * 500 * 5);
  EXPECT_EQ(events.back()["args"]["sampled"], false);
  EXPECT_EQ(events.back()["args"]["sampled_out_events"], 0);
}

TEST_F(Observe, HourLongTraceIsSampledToABoundedRateAndSaysSo) {
  // Issue 26: --trace wrote ~20 MB a second, so an hour's trace could not be opened. An hour
  // at 500 steps a second (9 M events, ~1 GB in full) keeps the first 10 s whole and then a
  // bounded rate, to the end of the run.
  const std::string path = dir_ / "hour.json";
  constexpr std::int64_t kSeconds = 3600, kRate = 500;
  {
    Tracer t(path, 1 << 20);
    synthetic_run(t, kSeconds, kRate);
  }
  const auto bytes = std::filesystem::file_size(path);
  EXPECT_LT(bytes, 24u << 20) << "an hour's trace of " << bytes << " bytes";
  const nlohmann::json events = read_json(path);
  std::size_t kept = 0;
  double last_ts = 0, sampled_from = -1;
  std::map<std::int64_t, int> per_step;  // events kept of each step past the first 10 s
  std::map<std::int64_t, int> waits_per_second;
  for (const auto& e : events) {
    if (e["ph"] == "i") sampled_from = e["ts"].get<double>() * 1e-6;
    if (e["ph"] != "X" && e["ph"] != "C") continue;
    ++kept;
    const double ts = e["ts"].get<double>() * 1e-6;
    last_ts = std::max(last_ts, ts);
    if (ts < 10) continue;
    if (e["args"].contains("step")) ++per_step[e["args"]["step"].get<std::int64_t>()];
    if (e["name"] == "wait") ++waits_per_second[static_cast<std::int64_t>(ts)];
  }
  // The first 10 s whole (5 events per step), then the sampled part runs to the end.
  EXPECT_GE(kept, 10u * kRate * 5);
  EXPECT_NEAR(sampled_from, 10, 0.01);
  EXPECT_GT(last_ts, kSeconds - 2);
  // A step is kept whole or not at all, at most 5 steps (rounded to a power-of-two stride) a
  // second; other events at most 5 a second per track and name.
  for (const auto& [step, n] : per_step) EXPECT_EQ(n, 3) << "step " << step;
  EXPECT_LE(per_step.size(), static_cast<std::size_t>(5 * (kSeconds - 10)));
  EXPECT_GE(per_step.size(), static_cast<std::size_t>(2 * (kSeconds - 10)));
  for (const auto& [second, n] : waits_per_second) EXPECT_LE(n, 5) << "second " << second;
  const auto& meta = events.back()["args"];
  EXPECT_EQ(meta["sampled"], true);
  EXPECT_EQ(meta["sampled_out_events"].get<std::size_t>() + kept,
            static_cast<std::size_t>(kSeconds * kRate * 5));
  EXPECT_NE(meta["sampling"].get<std::string>().find("at most 5 steps a second"),
            std::string::npos);
  EXPECT_EQ(meta["dropped_events"], 0);
}

TEST_F(Observe, TraceSampledFromTheByteBudgetOnKeepsTheRateAtOnce) {
  // The byte budget is reached mid-second (20 000 steps a second, 256 kB): from the event
  // that starts sampling on, at most 5 steps a second are kept (in a power-of-two stride from
  // the rate so far), also in the rest of that second.
  const std::string path = dir_ / "budget.json";
  {
    Tracer t(path, 1 << 20, {.full_bytes = 256 << 10});
    synthetic_steps(t, 0, 10'000, 20'000);  // 0.5 s, ~1.3 MB: the writer drains it
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    synthetic_steps(t, 10'000, 400'000, 20'000);  // to 20 s: sampled from 0.5 s on
  }
  const nlohmann::json events = read_json(path);
  double from = -1;
  for (const auto& e : events)
    if (e["ph"] == "i") from = e["ts"].get<double>();
  ASSERT_GE(from, 0);
  std::map<std::int64_t, std::set<std::int64_t>> steps;  // per second: the steps kept
  for (const auto& e : events)
    if (e["ph"] == "X" && e["ts"].get<double>() > from && e["args"].contains("step"))
      steps[static_cast<std::int64_t>(e["ts"].get<double>() * 1e-6)].insert(
          e["args"]["step"].get<std::int64_t>());
  for (const auto& [second, kept] : steps) EXPECT_LE(kept.size(), 6u) << "second " << second;
  EXPECT_EQ(events.back()["args"]["sampled"], true);
}

TEST_F(Observe, MetricsLinesComeEveryIntervalAndParse) {
  const std::string path = dir_ / "m.jsonl";
  std::vector<MetricsSample> seen;
  {
    LoaderOptions o{.epochs = 1};
    o.metrics = path;
    o.metrics_interval_s = 0.01;
    o.on_metrics = [&](const MetricsSample& s) { seen.push_back(s); };
    Loader loader(pipeline(std::chrono::microseconds(40)), o);
    int i = 0;
    while (loader.next()) {
      if (++i == 30) loader.save_checkpoint(dir_ / "ck");
    }
  }
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::ordered_json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::ordered_json::parse(line));
  ASSERT_GE(lines.size(), 3u);
  ASSERT_EQ(lines.size(), seen.size());
  double t = 0;
  std::uint64_t step = 0;
  std::size_t checkpoints = 0;
  std::map<std::string, double> busy_s;  // per node: its busy seconds per thread so far
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& j = lines[i];
    for (const char* key : {"t", "step", "epoch", "samples_per_s", "mb_per_s", "in_flight", "busy",
                            "threads", "consumer_wait", "rss_bytes", "checkpoints"})
      ASSERT_TRUE(j.contains(key)) << key << " in " << j;
    EXPECT_GT(j["t"].get<double>(), t);
    const double dt = j["t"].get<double>() - t;
    t = j["t"];
    EXPECT_GE(j["step"].get<std::uint64_t>(), step);
    step = j["step"];
    EXPECT_GT(j["samples_per_s"].get<double>(), 0);
    EXPECT_GT(j["rss_bytes"].get<std::uint64_t>(), 0u);
    EXPECT_TRUE(j["busy"].contains("map:augment")) << j;
    EXPECT_EQ(j["threads"]["map:augment"], 2);
    for (const auto& [name, share] : j["busy"].items()) {
      EXPECT_GE(share.get<double>(), 0) << name;
      // A batch's time counts when it ends, so one short interval may hold several intervals'
      // work (without bound on a loaded machine); but a thread is never busy for longer than
      // the run has lasted.
      busy_s[name] += share.get<double>() * dt;
      EXPECT_LE(busy_s[name], t * 1.1 + 0.02) << name << " by t = " << t;
    }
    for (const auto& c : j["checkpoints"]) {
      EXPECT_EQ(c["step"], 30);
      EXPECT_GT(c["write_s"].get<double>(), 0);
      ++checkpoints;
    }
    // The callback got the same sample.
    EXPECT_EQ(to_json_line(seen[i]), j.dump());
    EXPECT_EQ(to_json_line(parse_metrics_line(j.dump())), j.dump());
  }
  EXPECT_EQ(checkpoints, 1u);
}

TEST_F(Observe, StatsAndTracingNeverChangeTheBatches) {
  std::vector<std::uint64_t> plain, traced;
  {
    Loader loader(pipeline(std::chrono::microseconds(0)), {.epochs = 1});
    while (auto b = loader.next()) plain.push_back(b->digest());
  }
  {
    LoaderOptions o{.epochs = 1, .workers = 3};
    o.trace = dir_ / "t.json";
    o.metrics = dir_ / "m.jsonl";
    Loader loader(pipeline(std::chrono::microseconds(0)), o);
    while (auto b = loader.next()) traced.push_back(b->digest());
  }
  EXPECT_EQ(plain, traced);
}

TEST(ObserveMix, EveryInputNodeCountsItsPulls) {
  TempDir dir;
  const std::string a = testing::write_records(dir / "a", 200, 16, 2);
  const std::string b = testing::write_records(dir / "b", 300, 16, 2);
  auto input = [](const std::string& glob, bool shuffle) {
    Pipeline::Builder p;
    p.records({.paths = {glob}, .record_bytes = 16});
    if (shuffle) p.shuffle({.mode = ShuffleMode::kGlobal});
    return p.build_input();
  };
  Loader l(Pipeline::Builder()
               .seed(3)
               .mix({input(a, true), input(b, false)}, {.weights = {1, 1}})
               .batch({.size = 10})
               .build(),
           {.epochs = 1});
  std::uint64_t samples = 0;
  while (auto batch = l.next()) samples += batch->info.num_samples;
  const LoaderStats s = l.stats();
  std::map<std::string, const LoaderStats::Node*> by_name;
  for (const auto& n : s.nodes) by_name[n.name] = &n;
  // The mix pulls each input's last node (mix[0]/shuffle, mix[1]/records). (mix[0]/records
  // is read by its global shuffle through at(), which is not timed: it counts as the
  // shuffle's.)
  for (const char* name : {"mix[0]/shuffle", "mix[1]/records"}) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_GT(by_name[name]->calls, 0u) << name;
    EXPECT_GT(by_name[name]->items, 0u) << name;
  }
  // Every sample the mix emitted came out of one of its inputs' last nodes.
  EXPECT_EQ(by_name["mix[0]/shuffle"]->items + by_name["mix[1]/records"]->items,
            by_name["mix"]->items);
  EXPECT_EQ(by_name["mix"]->items, samples);
}

}  // namespace
}  // namespace flowstate
