// JSON Lines reading speed (issue 15's target: >= 300 MB/s of JSONL per core for
// {"id": ..., "tokens": [...]} lines): LinesSource::read of every line of a generated file,
// on one thread, as a batch-assembly worker reads them. Reported as bytes of JSONL per second.
//
//   build/release/bench/jsonl_bench --benchmark_filter=BM_Jsonl
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "flowstate/core/rng.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/lines.h"

namespace flowstate {
namespace {

/// A JSONL file of `docs` lines {"id": i, "tokens": [...]} with 20 to 400 tokens below 50257
/// (about 2.5 kB per line), written once per process.
const std::string& jsonl_file() {
  static const std::string path = [] {
    const auto p = std::filesystem::temp_directory_path() / "flowstate-jsonl-bench.jsonl";
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    for (std::uint64_t i = 0; i < 20000; ++i) {
      ElementRng rng(7, i);
      const std::uint64_t n = 20 + rng.below(381);
      std::string line = "{\"id\": " + std::to_string(i) + ", \"tokens\": [";
      for (std::uint64_t j = 0; j < n; ++j) {
        if (j > 0) line += ", ";
        line += std::to_string(rng.below(50257));
      }
      line += "]}\n";
      out << line;
    }
    std::filesystem::remove(p.string() + ".fsidx");
    return p.string();
  }();
  return path;
}

void read_every_line(benchmark::State& state, const LinesOptions& options) {
  LinesSource src("lines", options);
  const std::uint64_t n = src.size(0);
  std::uint64_t bytes = 0;
  for (std::uint64_t i = 0; i < n; ++i) bytes += src.record(src.at(0, i)).size();
  for (auto _ : state) {
    for (std::uint64_t i = 0; i < n; ++i) {
      Sample s;
      src.read(src.at(0, i), s);
      benchmark::DoNotOptimize(s);
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

void BM_JsonlFields(benchmark::State& state) {
  read_every_line(
      state,
      {.paths = {jsonl_file()}, .format = LinesFormat::kJsonl, .json_fields = {"id", "tokens"}});
}
BENCHMARK(BM_JsonlFields)->Unit(benchmark::kMillisecond);

void BM_JsonlValidateOnly(benchmark::State& state) {
  read_every_line(state, {.paths = {jsonl_file()}, .format = LinesFormat::kJsonl});
}
BENCHMARK(BM_JsonlValidateOnly)->Unit(benchmark::kMillisecond);

void BM_TextLines(benchmark::State& state) { read_every_line(state, {.paths = {jsonl_file()}}); }
BENCHMARK(BM_TextLines)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace flowstate

BENCHMARK_MAIN();
