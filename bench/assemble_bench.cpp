// Turning planned batches into collated ones (BatchAssembler), in bytes per second, on 1 and 2
// threads at once (the Loader's parallel assembly stage), against a plain memcpy gather.
// Data: 64 Mi of 1 KiB records in 8 files (bigger than the last-level cache), batches of 256
// random records.
//
//   BM_GatherCeiling             memcpy of the records into one buffer, addresses precomputed
//   BM_Gather/threads:N          BatchAssembler fast path: records straight into a pooled buffer
//   BM_Collate/threads:N         the per-sample path (a no-op sample map forces it): read each
//                                record into its own Sample, then stack
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "bench/bench_data.h"
#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/sources/records.h"

namespace flowstate::bench {
namespace {

constexpr std::uint64_t kRecords = 65536;
constexpr std::size_t kRecordBytes = 1024;
constexpr std::size_t kBatch = 256;

struct Data {
  ScratchDir dir{"flowstate-assemble-bench"};
  std::string glob = write_records(dir.path(), kRecords, kRecordBytes, 8);
  RecordsSource source{"records", {.paths = {glob}, .record_bytes = kRecordBytes}};
  std::vector<std::vector<Ref>> batches;  // random batches of Refs
  Data() {
    warm_page_cache(glob);
    std::vector<std::uint64_t> order(kRecords);
    for (std::uint64_t i = 0; i < kRecords; ++i) order[i] = i;
    std::mt19937_64 rng(7);
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t b = 0; b + kBatch <= order.size(); b += kBatch) {
      std::vector<Ref> refs(kBatch);
      for (std::size_t j = 0; j < kBatch; ++j) refs[j] = source.at(0, order[b + j]);
      batches.push_back(std::move(refs));
    }
  }
};

Data& data() {
  static Data d;
  return d;
}

void BM_GatherCeiling(benchmark::State& state) {
  Data& d = data();
  std::vector<std::byte> out(kBatch * kRecordBytes);
  std::vector<std::vector<const std::byte*>> addrs;
  for (const auto& refs : d.batches) {
    std::vector<const std::byte*> a;
    for (const Ref& r : refs) a.push_back(d.source.record(r).data());
    addrs.push_back(std::move(a));
  }
  std::size_t b = 0;
  for (auto _ : state) {
    const auto& a = addrs[b++ % addrs.size()];
    for (std::size_t j = 0; j < kBatch; ++j)
      std::memcpy(out.data() + j * kRecordBytes, a[j], kRecordBytes);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kRecordBytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
}
BENCHMARK(BM_GatherCeiling)->UseRealTime();

void assemble_loop(benchmark::State& state, const BatchAssembler& assembler) {
  Data& d = data();
  // Threads start at different batches so they do not read the same records in lockstep.
  std::size_t b = static_cast<std::size_t>(state.thread_index()) * d.batches.size() / 2;
  for (auto _ : state) {
    BatchPlan plan;
    plan.info.refs = d.batches[b++ % d.batches.size()];
    plan.info.num_samples = kBatch;
    Batch batch = assembler.assemble(std::move(plan));
    benchmark::DoNotOptimize(batch.fields.begin());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kBatch * kRecordBytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBatch));
}

void BM_Gather(benchmark::State& state) {
  static BatchAssembler assembler(&data().source, "records", {.size = kBatch}, {}, {},
                                  BufferPool::host());
  assemble_loop(state, assembler);
}
BENCHMARK(BM_Gather)->Threads(1)->Threads(2)->UseRealTime();

void BM_Collate(benchmark::State& state) {
  static BatchAssembler assembler(&data().source, "records", {.size = kBatch},
                                  {{"noop", 1, [](Sample&, MapContext&) {}}}, {},
                                  BufferPool::host());
  assemble_loop(state, assembler);
}
BENCHMARK(BM_Collate)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace flowstate::bench

BENCHMARK_MAIN();
