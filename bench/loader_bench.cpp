// The Loader end to end: what the graph costs per batch (tiny 8-byte records, so the copy is
// negligible and every microsecond is scheduling, hand-off and bookkeeping), and a W1-shaped
// run on 64 Mi of 1 KiB records.
//
//   BM_LoaderNext/workers:W/batch:B   batches/s; 1 / batch throughput is the per-batch cost
//   BM_LoaderW1/workers:W             1 KiB records, buffer shuffle 16384, batch 256: bytes/s
#include <benchmark/benchmark.h>

#include "bench/bench_data.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"

namespace flowstate::bench {
namespace {

const std::string& tiny_glob() {
  static ScratchDir dir("flowstate-loader-bench");
  static const std::string glob = write_records(dir.path(), 1 << 20, 8, 8);
  return glob;
}

const std::string& w1_glob() {
  static ScratchDir dir("flowstate-loader-bench-w1");
  static const std::string glob = [] {
    std::string g = write_records(dir.path(), 65536, kW1RecordBytes, 8);
    warm_page_cache(g);
    return g;
  }();
  return glob;
}

void drain(benchmark::State& state, Loader& loader) {
  loader.next();  // the graph is started and warm
  std::uint64_t samples = 0, bytes = 0;
  for (auto _ : state) {
    std::optional<Batch> b = loader.next();
    samples += b->info.num_samples;
    for (const auto& [id, t] : b->fields) bytes += t.nbytes();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(samples));
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["batches/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  const LoaderStats s = loader.stats();
  state.counters["consumer_waits"] = static_cast<double>(s.consumer_waits);
  state.counters["graph_waits"] = static_cast<double>(s.graph_waits);
}

void BM_LoaderNext(benchmark::State& state) {
  Pipeline p = Pipeline::Builder()
                   .seed(1)
                   .workers(static_cast<int>(state.range(0)))
                   .records({.paths = {tiny_glob()}, .record_bytes = 8})
                   .batch({.size = static_cast<std::uint64_t>(state.range(1))})
                   .build();
  Loader loader(p, {.epochs = 0});
  drain(state, loader);
}
BENCHMARK(BM_LoaderNext)
    ->ArgNames({"workers", "batch"})
    ->ArgsProduct({{1, 2}, {1, 256}})
    ->UseRealTime();

void BM_LoaderW1(benchmark::State& state) {
  Loader loader(w1_pipeline(w1_glob(), {.workers = static_cast<int>(state.range(0))}),
                {.epochs = 0});
  drain(state, loader);
}
BENCHMARK(BM_LoaderW1)->ArgName("workers")->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace flowstate::bench

BENCHMARK_MAIN();
