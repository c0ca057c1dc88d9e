// Host→device bandwidth of device_copy, in bytes per second, for batches of 256 KiB to 64 MiB.
// `--benchmark_filter=bytes:262144/` selects the smallest size.
//
//   BM_DeviceCopy/bytes:N/in_flight:D   pinned staging buffers (the pipeline's path); with
//                                       one batch in flight each copy is waited for before
//                                       the next starts, with several they queue on the stream.
//   BM_DeviceCopyPageable/bytes:N       plain host memory, for comparison.
//
// Without a CUDA device (or without CUDA in the build) it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <string>

#include "flowstate/core/error.h"
#include "flowstate/nodes/device_copy.h"

namespace flowstate {
namespace {

Batch staged_batch(BufferPool& pool, std::size_t bytes) {
  Batch b;
  b.fields.set("data", Tensor(pool.acquire(bytes), 0, DType::kUInt8,
                              Shape{static_cast<std::int64_t>(bytes)}));
  return b;
}

void BM_DeviceCopy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto depth = static_cast<std::size_t>(state.range(1));
  DeviceCopy copy({.device = "cuda:0"});
  auto pool = copy.staging_pool();
  {
    // Allocate (and touch) the staging and device blocks the loop needs, outside the timing.
    std::deque<Batch> warm;
    for (std::size_t i = 0; i <= depth; ++i) {
      Batch b = staged_batch(*pool, bytes);
      std::memset(b["data"].data(), static_cast<int>(i), bytes);
      warm.push_back(copy.copy(std::move(b)));
    }
    for (Batch& b : warm) b.fence->wait();
  }
  std::deque<Batch> in_flight;
  for (auto _ : state) {
    in_flight.push_back(copy.copy(staged_batch(*pool, bytes)));
    if (in_flight.size() >= depth) {
      in_flight.front().fence->wait();
      in_flight.pop_front();
    }
  }
  for (Batch& b : in_flight) b.fence->wait();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
  state.counters["staging_blocks"] = static_cast<double>(pool->allocated());
}

void BM_DeviceCopyPageable(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  DeviceCopy copy({.device = "cuda:0"});
  Tensor source(DType::kUInt8, Shape{static_cast<std::int64_t>(bytes)});
  std::memset(source.data(), 1, bytes);
  {
    Batch warm;
    warm.fields.set("data", source);
    copy.copy(std::move(warm)).fence->wait();
  }
  for (auto _ : state) {
    Batch b;
    b.fields.set("data", source);
    Batch out = copy.copy(std::move(b));
    out.fence->wait();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
}

constexpr std::int64_t kMin = 256 << 10;
constexpr std::int64_t kMax = 64 << 20;

BENCHMARK(BM_DeviceCopy)
    ->ArgNames({"bytes", "in_flight"})
    ->ArgsProduct({benchmark::CreateRange(kMin, kMax, 4), {1, 4}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DeviceCopyPageable)
    ->ArgName("bytes")
    ->RangeMultiplier(4)
    ->Range(kMin, kMax)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace flowstate

int main(int argc, char** argv) {
  if (flowstate::cuda_device_count() == 0) {
    // The node's own error says why (no CUDA in the build, no driver, no device).
    std::string why = "no CUDA device";
    try {
      flowstate::DeviceCopy probe({.device = "cuda:0"});
    } catch (const flowstate::Error& e) {
      why = e.what();
    }
    std::printf("device_copy_bench: skipped, no CUDA device to copy to: %s\n", why.c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
