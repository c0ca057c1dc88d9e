#include "bench/bench_data.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/records.h"

namespace flowstate::bench {

namespace fs = std::filesystem;

ScratchDir::ScratchDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("cannot create a scratch directory " + tmpl + ": " +
                             std::strerror(errno));
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards) {
  fs::create_directories(dir);
  for (std::size_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%05zu.bin", s);
    const fs::path path = fs::path(dir) / name;
    const std::uint64_t begin = records * s / shards, end = records * (s + 1) / shards;
    std::error_code ec;
    if (fs::file_size(path, ec) == (end - begin) * record_bytes && !ec) continue;
    // A DataError (a std::runtime_error) names the file when it cannot be written.
    write_synthetic_records(path.string(), begin, end, record_bytes, /*seed=*/7);
  }
  return (fs::path(dir) / "part-*.bin").string();
}

std::uint64_t warm_page_cache(const std::string& glob) {
  std::uint64_t total = 0;
  std::vector<char> buf(1 << 20);
  for (const auto& f : expand_paths({glob})) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + f + ": " + std::strerror(errno));
    for (;;) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n <= 0) break;
      total += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
  }
  return total;
}

Pipeline w1_pipeline(const std::string& glob, const W1Options& o) {
  Pipeline::Builder b;
  b.seed(o.seed)
      .workers(o.workers)
      .records({.paths = {glob}, .record_bytes = kW1RecordBytes})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = o.shuffle});
  if (o.map_rounds > 0) {
    const int rounds = o.map_rounds;
    b.map([rounds](Sample& s, MapContext&) { heavy_map(s, rounds); },
          {.name = "heavy_map", .params = {{"rounds", std::to_string(rounds)}}});
  }
  return b.batch({.size = o.batch}).prefetch({.depth = o.prefetch}).build();
}

void heavy_map(Sample& sample, int rounds) {
  for (auto& [id, t] : sample) {
    auto* p = static_cast<std::uint8_t*>(t.data());
    const std::size_t n = t.nbytes();
    std::uint32_t h = 2166136261u;
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        // A dependent chain: one multiply-add per byte, not vectorizable.
        h = (h ^ p[i]) * 16777619u;
        p[i] = static_cast<std::uint8_t>(h >> 24);
      }
    }
  }
}

double map_cost_ns(std::size_t record_bytes, int rounds) {
  Sample s;
  Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(record_bytes)});
  std::memset(t.data(), 7, record_bytes);
  s.set("data", t);
  std::vector<double> runs;
  constexpr int kIters = 2000;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) heavy_map(s, rounds);
    runs.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
        kIters);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace flowstate::bench
