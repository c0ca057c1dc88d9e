// Checkpoints on a W1-shaped pipeline (buffer shuffle 16 384, batch 256; 128 Ki records of
// 64 bytes, so the numbers are the checkpoint's, not the copy's):
//
//   BM_SaveCheckpoint             Loader::save_checkpoint: state, write, fsync, rename, LATEST
//   BM_SaveCheckpointAsync        the consumer's share of save_checkpoint_async (the future is
//                                 waited for outside the timing)
//   BM_FirstBatch/<pct>           a fresh Loader to its first batch: from scratch (pct 0), or
//                                 after load_state of a state taken at pct% of an epoch
//   BM_RestoreFirstBatch/<pct>    the same through Loader::restore(dir) of a checkpoint
#include <benchmark/benchmark.h>

#include <filesystem>
#include <future>
#include <map>

#include "bench/bench_data.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"

namespace flowstate::bench {
namespace {

constexpr std::uint64_t kRecords = 131072;
constexpr std::size_t kRecordBytes = 64;

struct Data {
  ScratchDir dir{"flowstate-ckpt-bench"};
  std::string glob = write_records(dir.path() + "/data", kRecords, kRecordBytes, 8);
  Pipeline pipeline = Pipeline::Builder()
                          .seed(1234)
                          .workers(2)
                          .records({.paths = {glob}, .record_bytes = kRecordBytes})
                          .shuffle({.mode = ShuffleMode::kBuffer, .size = 16384})
                          .batch({.size = 256})
                          .build();
  std::map<int, std::string> states;  // pct -> encoded state
  std::map<int, std::string> ckpts;   // pct -> checkpoint directory

  /// The state after `pct`% of the first epoch, and a checkpoint of it.
  const std::string& state_at(int pct) {
    if (auto it = states.find(pct); it != states.end()) return it->second;
    Loader l(pipeline, {.epochs = 0});
    const std::uint64_t batches = kRecords / 256 * static_cast<std::uint64_t>(pct) / 100;
    for (std::uint64_t i = 0; i < batches; ++i) l.next();
    ckpts[pct] = dir.path() + "/restore-" + std::to_string(pct);
    l.save_checkpoint(ckpts[pct]);
    return states[pct] = l.state();
  }
};

Data& data() {
  static Data d;
  return d;
}

void BM_SaveCheckpoint(benchmark::State& state) {
  Data& d = data();
  const std::string dir = d.dir.path() + "/save";
  Loader loader(d.pipeline, {.epochs = 0});
  for (int i = 0; i < 200; ++i) loader.next();  // a key-frame is in the state
  std::size_t bytes = loader.state().size();
  for (auto _ : state) benchmark::DoNotOptimize(loader.save_checkpoint(dir, {.keep = 2}));
  state.counters["state_bytes"] = static_cast<double>(bytes);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SaveCheckpoint)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_SaveCheckpointAsync(benchmark::State& state) {
  Data& d = data();
  const std::string dir = d.dir.path() + "/save-async";
  Loader loader(d.pipeline, {.epochs = 0});
  for (int i = 0; i < 200; ++i) loader.next();
  for (auto _ : state) {
    std::future<std::string> f = loader.save_checkpoint_async(dir, {.keep = 2});
    state.PauseTiming();
    f.get();
    state.ResumeTiming();
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SaveCheckpointAsync)->UseRealTime()->Unit(benchmark::kMicrosecond);

void BM_FirstBatch(benchmark::State& state) {
  Data& d = data();
  const int pct = static_cast<int>(state.range(0));
  const std::string s = pct == 0 ? std::string() : d.state_at(pct);
  for (auto _ : state) {
    Loader l(d.pipeline, {.epochs = 0});
    if (!s.empty()) l.load_state(s);
    benchmark::DoNotOptimize(l.next());
  }
}
BENCHMARK(BM_FirstBatch)
    ->ArgName("pct")
    ->Arg(0)
    ->Arg(50)
    ->Arg(99)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void BM_RestoreFirstBatch(benchmark::State& state) {
  Data& d = data();
  const int pct = static_cast<int>(state.range(0));
  d.state_at(pct);
  const std::string dir = d.ckpts[pct];
  for (auto _ : state) {
    Loader l(d.pipeline, {.epochs = 0});
    l.restore(dir);
    benchmark::DoNotOptimize(l.next());
  }
}
BENCHMARK(BM_RestoreFirstBatch)
    ->ArgName("pct")
    ->Arg(0)
    ->Arg(50)
    ->Arg(99)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace flowstate::bench

BENCHMARK_MAIN();
