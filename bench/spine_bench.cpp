// The stateful spine, in Refs per second: each node pulling 256-Ref chunks from a `records`
// source (1 Mi records of 8 bytes in 8 files — spine nodes never read record bytes), the batch
// planner, a whole Spine::next (planning plus the stamp), a stamp alone, and Loader::state().
//
//   BM_RecordsPull                 the source alone (file lookup per Ref)
//   BM_ShardPull/<mode>            shard world 4 rank 1, 0 = interleave, 1 = contiguous
//   BM_GlobalShufflePull           Feistel bijection per Ref
//   BM_BufferShufflePull/<size>    seeded buffer, key-frame every <size> draws
//   BM_BatchPlan/<size>            records → buffer shuffle → planner, no stamp
//   BM_SpineNext/<size>            the same through Spine::next: planning + snapshot (stamp)
//   BM_SpineSnapshot/<size>        the stamp alone
//   BM_SerializeStamp/<size>       encoding a stamp (what state() pays), bytes
//   BM_LoaderState/<size>          Loader::state() on a running W1-shaped loader
//   BM_LoaderStateEvery100/<size>  the same with 100 batches between calls (a checkpoint
//                                  every 100 steps: usually a new shuffle key-frame to encode)
//   BM_OpenRecords/<files>         opening a `records` source of <files> files of 1 MiB
//                                  (mmap + data identity); counter state_bytes: its state
//   BM_DataIdentity/<files>        the data identity alone (4 sampled 4 KiB blocks per file)
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "bench/bench_data.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/spine.h"
#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/shard.h"
#include "flowstate/nodes/shuffle.h"
#include "flowstate/nodes/sources/records.h"

namespace flowstate::bench {
namespace {

constexpr std::uint64_t kRecords = 1 << 20;
constexpr std::size_t kRecordBytes = 8;
constexpr std::size_t kChunk = 256;

/// The benchmark's data, written once per process.
const std::string& spine_glob() {
  static ScratchDir dir("flowstate-spine-bench");
  static const std::string glob = write_records(dir.path(), kRecords, kRecordBytes, 8);
  return glob;
}

std::unique_ptr<RecordsSource> make_source() {
  return std::make_unique<RecordsSource>(
      "records", RecordsOptions{.paths = {spine_glob()}, .record_bytes = kRecordBytes});
}

/// Pulls chunks from `node` (starting a new epoch when one ends) and counts Refs.
void pull_loop(benchmark::State& state, SpineNode& node) {
  std::vector<Ref> chunk(kChunk);
  std::uint64_t epoch = 0;
  node.start_epoch(epoch);
  std::uint64_t refs = 0;
  for (auto _ : state) {
    std::size_t n = node.pull(chunk);
    if (n < chunk.size()) node.start_epoch(++epoch);
    refs += n;
    benchmark::DoNotOptimize(chunk.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(refs));
  state.counters["ns/ref"] = benchmark::Counter(
      static_cast<double>(refs), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_RecordsPull(benchmark::State& state) {
  auto src = make_source();
  pull_loop(state, *src);
}
BENCHMARK(BM_RecordsPull);

void BM_ShardPull(benchmark::State& state) {
  auto src = make_source();
  ShardNode shard("shard",
                  {.rank = 1,
                   .world = 4,
                   .mode = state.range(0) == 0 ? ShardMode::kInterleave : ShardMode::kContiguous});
  shard.connect(src.get());
  pull_loop(state, shard);
}
BENCHMARK(BM_ShardPull)->ArgName("contiguous")->Arg(0)->Arg(1);

void BM_GlobalShufflePull(benchmark::State& state) {
  auto src = make_source();
  GlobalShuffleNode shuffle("shuffle", 1234);
  shuffle.connect(src.get());
  pull_loop(state, shuffle);
}
BENCHMARK(BM_GlobalShufflePull);

void BM_BufferShufflePull(benchmark::State& state) {
  auto src = make_source();
  BufferShuffleNode shuffle("shuffle", 1234, static_cast<std::uint64_t>(state.range(0)));
  shuffle.connect(src.get());
  pull_loop(state, shuffle);
}
BENCHMARK(BM_BufferShufflePull)->ArgName("size")->Arg(1024)->Arg(16384)->Arg(262144);

/// records → buffer shuffle(size) → batch(256), instantiated by hand.
struct PlannerChain {
  std::unique_ptr<RecordsSource> src = make_source();
  std::unique_ptr<BufferShuffleNode> shuffle;
  std::unique_ptr<BatchPlanner> planner;
  explicit PlannerChain(std::uint64_t size) {
    shuffle = std::make_unique<BufferShuffleNode>("shuffle", 1234, size);
    shuffle->connect(src.get());
    planner = std::make_unique<BatchPlanner>("batch", BatchOptions{.size = kChunk});
    planner->connect(shuffle.get());
    planner->set_epochs(0);
  }
};

void BM_BatchPlan(benchmark::State& state) {
  PlannerChain c(static_cast<std::uint64_t>(state.range(0)));
  std::uint64_t refs = 0;
  for (auto _ : state) {
    std::optional<BatchPlan> plan = c.planner->next();
    refs += plan->info.refs.size();
    benchmark::DoNotOptimize(plan->info.refs.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(refs));
}
BENCHMARK(BM_BatchPlan)->ArgName("shuffle")->Arg(16384);

Pipeline spine_pipeline(std::uint64_t size) {
  return Pipeline::Builder()
      .seed(1234)
      .records({.paths = {spine_glob()}, .record_bytes = kRecordBytes})
      .shard({.rank = 0, .world = 1})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = size})
      .batch({.size = kChunk})
      .build();
}

void BM_SpineNext(benchmark::State& state) {
  Spine spine(spine_pipeline(static_cast<std::uint64_t>(state.range(0))), 0);
  std::uint64_t refs = 0;
  for (auto _ : state) {
    std::optional<BatchPlan> plan = spine.next();
    refs += plan->info.refs.size();
    benchmark::DoNotOptimize(plan->stamp.get());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(refs));
  state.counters["batches/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SpineNext)->ArgName("shuffle")->Arg(16384);

void BM_SpineSnapshot(benchmark::State& state) {
  Spine spine(spine_pipeline(static_cast<std::uint64_t>(state.range(0))), 0);
  for (int i = 0; i < 100; ++i) spine.next();  // past the first key-frame
  for (auto _ : state) {
    Stamp s = spine.snapshot();
    benchmark::DoNotOptimize(s.get());
  }
}
BENCHMARK(BM_SpineSnapshot)->ArgName("shuffle")->Arg(16384);

void BM_SerializeStamp(benchmark::State& state) {
  Spine spine(spine_pipeline(static_cast<std::uint64_t>(state.range(0))), 0);
  for (int i = 0; i < 100; ++i) spine.next();
  Stamp s = spine.snapshot();
  std::size_t bytes = 0;
  for (auto _ : state) {
    std::string enc = serialize_stamp(*s);
    bytes = enc.size();
    benchmark::DoNotOptimize(enc.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * state.iterations()));
  state.counters["stamp_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_SerializeStamp)->ArgName("shuffle")->Arg(16384);

void BM_LoaderState(benchmark::State& state) {
  Loader loader(spine_pipeline(static_cast<std::uint64_t>(state.range(0))), {.epochs = 0});
  for (int i = 0; i < 100; ++i) loader.next();
  std::size_t bytes = 0;
  for (auto _ : state) {
    std::string s = loader.state();
    bytes = s.size();
    benchmark::DoNotOptimize(s.data());
  }
  state.counters["state_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_LoaderState)->ArgName("shuffle")->Arg(16384);

/// Loader::state() as a checkpoint every 100 steps sees it: 100 batches (untimed) between
/// calls, so the shuffle's key-frame (taken every 64 batches of 256) is usually a new one.
void BM_LoaderStateEvery100(benchmark::State& state) {
  Loader loader(spine_pipeline(static_cast<std::uint64_t>(state.range(0))), {.epochs = 0});
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < 100; ++i) loader.next();
    state.ResumeTiming();
    std::string s = loader.state();
    benchmark::DoNotOptimize(s.data());
  }
}
BENCHMARK(BM_LoaderStateEvery100)->ArgName("shuffle")->Arg(16384);

/// `files` files of 1 MiB (16 Ki records of 64 bytes), written once per file count.
const std::string& identity_glob(std::uint64_t files) {
  static ScratchDir dir("flowstate-identity-bench");
  static std::map<std::uint64_t, std::string> globs;
  auto& g = globs[files];
  if (g.empty())
    g = write_records(dir.path() + "/" + std::to_string(files), files << 14, 64,
                      static_cast<std::size_t>(files));
  return g;
}

void BM_OpenRecords(benchmark::State& state) {
  const std::string& glob = identity_glob(static_cast<std::uint64_t>(state.range(0)));
  std::size_t bytes = 0;
  for (auto _ : state) {
    RecordsSource source("records", {.paths = {glob}, .record_bytes = 64});
    benchmark::DoNotOptimize(source.size(0));
    if (bytes == 0) {
      std::ostringstream os(std::ios::binary);
      {
        OutArchive ar(os);
        source.snapshot()->save(ar);
      }
      bytes = os.str().size();
    }
  }
  state.counters["state_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_OpenRecords)->ArgName("files")->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

void BM_DataIdentity(benchmark::State& state) {
  std::vector<std::unique_ptr<MappedFile>> maps;
  for (const auto& f : expand_paths({identity_glob(static_cast<std::uint64_t>(state.range(0)))}))
    maps.push_back(std::make_unique<MappedFile>(f));
  for (auto _ : state)
    for (const auto& m : maps) benchmark::DoNotOptimize(file_identity(m->path(), *m, 1));
}
BENCHMARK(BM_DataIdentity)->ArgName("files")->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace flowstate::bench

BENCHMARK_MAIN();
