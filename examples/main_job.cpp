// The main job: an LLM-style pre-training input pipeline on record files it generates, with
// a checkpoint and a resume.
//
//   1. writes N records of 1 KiB into 8 shard files (skipped when already there);
//   2. runs the pipeline uninterrupted for two epochs, recording every batch's digest;
//   3. runs it again, "crashes" (stops) mid-epoch after a checkpoint to disk;
//   4. resumes from the checkpoint directory in a fresh Loader with a different worker count
//      and checks that every later batch is identical, byte for byte, to the uninterrupted run.
//
// Usage: main_job [--dir DIR] [--records N] [--workers W]   (main_job --help says more)
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/rng.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"

namespace fs = std::filesystem;
using namespace flowstate;

namespace {

constexpr std::size_t kRecordBytes = 1024;
constexpr std::size_t kShards = 8;

void generate(const fs::path& dir, std::uint64_t records) {
  fs::create_directories(dir);
  std::vector<char> block(kRecordBytes * 1024);
  for (std::size_t s = 0; s < kShards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "train-%05zu.bin", s);
    fs::path path = dir / name;
    std::uint64_t begin = records * s / kShards, end = records * (s + 1) / kShards;
    if (fs::exists(path) && fs::file_size(path) == (end - begin) * kRecordBytes) continue;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    std::size_t used = 0;
    for (std::uint64_t i = begin; i < end; ++i) {
      char* rec = block.data() + used;
      for (std::size_t b = 0; b < kRecordBytes; b += 8) {
        std::uint64_t v = b == 0 ? i : philox64(7, i, b / 8);  // record i starts with i
        std::memcpy(rec + b, &v, 8);
      }
      used += kRecordBytes;
      if (used == block.size() || i + 1 == end) {
        out.write(block.data(), static_cast<std::streamsize>(used));
        used = 0;
      }
    }
    if (!out) throw DataError(path.string(), DataError::kNoOffset, "cannot write " + path.string());
  }
}

Pipeline make_pipeline(const fs::path& data) {
  return Pipeline::Builder()
      .seed(1234)
      .records({.paths = {(data / "train-*.bin").string()}, .record_bytes = kRecordBytes})
      .shard({.rank = 0, .world = 1})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 16384})
      .batch({.size = 256})
      .prefetch({.depth = 4})
      .build();
}

struct Run {
  std::vector<std::uint64_t> digests;  // by step
  double seconds = 0;
  std::uint64_t samples = 0;
};

// Consumes `loader` until it ends or `stop_after` batches were taken.
void consume(Loader& loader, Run& run, std::size_t stop_after = SIZE_MAX) {
  auto t0 = std::chrono::steady_clock::now();
  std::size_t taken = 0;
  while (taken < stop_after) {
    auto b = loader.next();
    if (!b) break;
    if (run.digests.size() <= b->info.step) run.digests.resize(b->info.step + 1);
    run.digests[b->info.step] = b->digest();
    run.samples += b->info.num_samples;
    ++taken;
  }
  run.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr const char* kUsage =
    "usage: main_job [--dir DIR] [--records N] [--workers W]\n\n"
    "Writes N records of 1 KiB into 8 shard files under DIR/data (skipped when already there),\n"
    "runs a pipeline on them for two epochs, runs it again with a checkpoint to DIR/checkpoints\n"
    "mid-epoch, resumes in a fresh loader and checks that every batch is identical.\n\n"
    "  --dir DIR       where the data and checkpoints go (default: build/demo, under the\n"
    "                  current directory; build/ is ignored by git)\n"
    "  --records N     records to generate (default 262144: 256 MiB)\n"
    "  --workers W     batch-assembly workers of the first runs (default 2)\n";

/// The value of an unsigned option; nullopt (after a message) when it is not a number.
std::optional<std::uint64_t> number(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    std::fprintf(stderr, "main_job: %s expects a non-negative integer, got '%s'\n%s", flag.c_str(),
                 text.c_str(), kUsage);
    return std::nullopt;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = "build/demo";
  std::uint64_t records = 262144;
  int workers = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a != "--dir" && a != "--records" && a != "--workers") {
      std::fprintf(stderr, "main_job: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "main_job: %s needs a value\n%s", a.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[++i];
    if (a == "--dir") {
      dir = value;
      continue;
    }
    const std::optional<std::uint64_t> n = number(a, value);
    if (!n) return 2;
    if (a == "--records") {
      records = *n;
    } else {
      if (*n < 1 || *n > 1024) {
        std::fprintf(stderr, "main_job: --workers must be between 1 and 1024\n");
        return 2;
      }
      workers = static_cast<int>(*n);
    }
  }
  try {
    const fs::path data = dir / "data", ckpt = dir / "checkpoints";
    std::printf("generating %llu records of %zu bytes in %zu shards under %s ...\n",
                static_cast<unsigned long long>(records), kRecordBytes, kShards, data.c_str());
    generate(data, records);

    // 1. Uninterrupted: two epochs.
    Run full;
    {
      Loader loader(make_pipeline(data), {.epochs = 2, .workers = workers});
      consume(loader, full);
    }
    const std::size_t steps = full.digests.size();
    const double mbps = static_cast<double>(full.samples * kRecordBytes) / full.seconds / 1e6;
    std::printf("uninterrupted: %zu batches over 2 epochs, %.2f M samples/s, %.0f MB/s\n", steps,
                static_cast<double>(full.samples) / full.seconds / 1e6, mbps);

    // 2. Interrupted mid-epoch 1, after a checkpoint to disk.
    const std::size_t crash_at = steps * 3 / 4;
    fs::remove_all(ckpt);
    Run first;
    {
      Loader loader(make_pipeline(data), {.epochs = 2, .workers = workers});
      consume(loader, first, crash_at);
      std::string path = loader.save_checkpoint(ckpt.string(), {.keep = 3});
      std::printf("checkpoint after step %zu: %s (%llu bytes of state)\n", crash_at - 1,
                  path.c_str(),
                  static_cast<unsigned long long>(fs::file_size(fs::path(path) / "state.bin")));
    }  // the Loader dies here, with batches prefetched ahead: they are not in the checkpoint

    // 3. Resume in a fresh Loader, with another worker count.
    Run resumed;
    resumed.digests = first.digests;
    Loader loader(make_pipeline(data), {.epochs = 2, .workers = workers == 1 ? 2 : 1});
    auto t0 = std::chrono::steady_clock::now();
    auto found = loader.restore(ckpt.string());
    if (!found) throw CheckpointError(ckpt.string(), "no checkpoint to resume from");
    auto first_batch = loader.next();
    double ttfb = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!first_batch) throw Error("the resumed run produced nothing");
    std::printf("resumed from %s at step %llu (epoch %llu, batch %llu of the epoch) in %.1f ms\n",
                found->path.c_str(), static_cast<unsigned long long>(first_batch->info.step),
                static_cast<unsigned long long>(first_batch->info.epoch),
                static_cast<unsigned long long>(first_batch->info.index_in_epoch), ttfb * 1e3);
    resumed.digests.resize(first_batch->info.step + 1);
    resumed.digests[first_batch->info.step] = first_batch->digest();
    consume(loader, resumed);

    std::size_t mismatches = 0;
    if (resumed.digests.size() != steps) ++mismatches;
    for (std::size_t s = 0; s < std::min(steps, resumed.digests.size()); ++s)
      if (resumed.digests[s] != full.digests[s]) ++mismatches;
    if (mismatches != 0) {
      std::printf("FAILED: %zu batches differ from the uninterrupted run\n", mismatches);
      return 1;
    }
    std::printf(
        "OK: all %zu batches of the interrupted + resumed run are identical to the "
        "uninterrupted run\n",
        steps);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "main_job: error: %s\n", e.what());
    return 1;
  }
}
