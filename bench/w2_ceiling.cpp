// The single-thread ceiling of W2 (docs/DESIGN.md §11): one thread copies the documents of a
// Megatron indexed data set, in a random order fixed up front, into rows of 2048 tokens with
// an end-of-document token after each, 8 rows to a batch buffer — what packing costs with no
// pipeline around it (no state, no checkpoint, no threads). Prints one JSON line:
//
//   w2_ceiling DIR/corpus.idx [--epochs N] [--label S] [--faults]
//
// The timed part is the copy alone, as fast as one thread does it (issue 26: an independently
// written copy ran at 2 305 M tokens/s where the first version of this file ran at ~1 200):
// the epoch's order is drawn before the clock starts, the .bin's pages are mapped at the open
// (MAP_POPULATE, in `open_s`, not timed; --faults maps them on first touch inside the timed
// copy instead, as a whole pipeline process pays them), and the next documents' index entries
// and first bytes are prefetched while one is copied (they lie at random places of the file).
// `cpu_s` is the process's CPU time over the timed copy.
//
// Only uint16 data sets (Megatron dtype code 8), as `flowstate gen indexed` writes them.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "w2_map.h"

namespace {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: w2_ceiling PREFIX.idx [--epochs N] [--label S]\n");
    return 2;
  }
  const std::string idx_path = argv[1];
  int epochs = 1;
  bool faults = false;
  std::string label;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--faults") faults = true;
    if (k == "--epochs" && i + 1 < argc) epochs = std::stoi(argv[++i]);
    if (k == "--label" && i + 1 < argc) label = argv[++i];
  }
  constexpr std::size_t kLength = 2048, kBatch = 8;
  constexpr std::size_t kAhead = 16;  // documents prefetched ahead of the one copied
  constexpr std::uint16_t kEos = 0;
  const auto t_open = std::chrono::steady_clock::now();
  const w2::Map idx = w2::map_file(idx_path, true);
  const w2::Map bin = w2::map_file(idx_path.substr(0, idx_path.size() - 4) + ".bin", !faults);
  if (load<std::uint8_t>(idx.data + 17) != 8) {
    std::fprintf(stderr, "w2_ceiling: only uint16 data sets\n");
    return 1;
  }
  const auto n = load<std::uint64_t>(idx.data + 18);
  const std::byte* lengths = idx.data + 34;
  const std::byte* pointers = lengths + 4 * n;
  std::vector<std::vector<std::uint32_t>> orders(static_cast<std::size_t>(epochs));
  for (int e = 0; e < epochs; ++e) {
    auto& order = orders[static_cast<std::size_t>(e)];
    order.resize(n);
    std::iota(order.begin(), order.end(), 0u);
    std::mt19937_64 rng(1234 + e);
    std::shuffle(order.begin(), order.end(), rng);
  }

  std::vector<std::uint16_t> batch(kLength * kBatch);
  std::size_t at = 0;  // tokens in `batch`
  std::uint64_t rows = 0, sink = 0;
  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& order : orders) {
    for (std::size_t k = 0; k < order.size(); ++k) {
      if (k + kAhead < order.size()) {  // the index entries of a document kAhead on ...
        const std::uint32_t q = order[k + kAhead];
        __builtin_prefetch(pointers + 8 * q);
        __builtin_prefetch(lengths + 4 * q);
      }
      if (k + kAhead / 2 < order.size()) {  // ... and the first bytes of one half as far
        const std::uint32_t q = order[k + kAhead / 2];
        const std::byte* p = bin.data + load<std::int64_t>(pointers + 8 * q);
        __builtin_prefetch(p);
        __builtin_prefetch(p + 64);
      }
      const std::uint32_t d = order[k];
      const auto* src =
          reinterpret_cast<const std::uint16_t*>(bin.data + load<std::int64_t>(pointers + 8 * d));
      std::size_t left = static_cast<std::size_t>(load<std::int32_t>(lengths + 4 * d)) + 1;
      while (left > 0) {
        const std::size_t take = std::min(left, batch.size() - at);
        const std::size_t body = std::min(take, left - 1);  // the EOS is the last token
        std::memcpy(batch.data() + at, src, body * 2);
        src += body;
        if (body < take) batch[at + body] = kEos;
        at += take;
        left -= take;
        if (at == batch.size()) {  // a full batch: "hand it on"
          sink += batch[rows % batch.size()];
          rows += kBatch;
          at = 0;
        }
      }
    }
    at = 0;  // the epoch's partial batch is dropped
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_s = cpu_seconds() - cpu0;
  const double open_s = std::chrono::duration<double>(t0 - t_open).count();
  std::printf(
      "{\"impl\": \"ceiling\", \"what\": \"w2\", \"workers\": 1, \"tokens_per_s\": %.1f, "
      "\"rows_per_s\": %.1f, \"seconds\": %.3f, \"cpu_s\": %.3f, \"open_s\": %.4f, \"epochs\": "
      "%d, \"faults_timed\": %s, \"sink\": %llu%s%s%s}\n",
      static_cast<double>(rows * kLength) / s, static_cast<double>(rows) / s, s, cpu_s, open_s,
      epochs, faults ? "true" : "false", static_cast<unsigned long long>(sink),
      label.empty() ? "" : ", \"label\": \"", label.c_str(), label.empty() ? "" : "\"");
  return 0;
}
