// Data and pipelines shared by the benchmarks: generated record files in a scratch directory,
// and the reference workload W1 of DESIGN.md §11 (262 144 records × 1 KiB in 8 shard files,
// buffer shuffle of 16 384, batch 256, collated to one contiguous uint8 [256, 1024] tensor).
//
//   bench::ScratchDir dir("flowstate-bench");
//   std::string glob = bench::write_records(dir.path(), bench::kW1Records, 1024, 8);
//   Pipeline p = bench::w1_pipeline(glob, {.workers = 2});
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flowstate/graph/pipeline.h"

namespace flowstate::bench {

inline constexpr std::uint64_t kW1Records = 262144;
inline constexpr std::size_t kW1RecordBytes = 1024;
inline constexpr std::size_t kW1Shards = 8;
inline constexpr std::uint64_t kW1ShuffleBuffer = 16384;
inline constexpr std::uint64_t kW1BatchSize = 256;

/// A fresh directory under $TMPDIR (or /tmp) named `prefix`-XXXXXX, removed recursively on
/// destruction. Throws std::runtime_error when it cannot be created.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "flowstate-bench");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Writes `records` records of `record_bytes` bytes into `shards` files part-00000.bin, ...
/// under `dir` (created if needed) and returns the glob matching them: the synthetic records
/// of nodes/sources/records.h with seed 7. Record i starts with i as a little-endian uint64;
/// the rest is deterministic noise. A file that already has the
/// right size is kept, so repeated runs reuse the data (and its page cache). Throws
/// std::runtime_error on I/O failure.
std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards);

/// Reads every byte of the files matching `glob` once, so they are in the page cache.
/// Returns the number of bytes read.
std::uint64_t warm_page_cache(const std::string& glob);

/// Knobs of the W1 pipeline that do not change its definition (or, for the map-heavy
/// variant, add a per-sample transform).
struct W1Options {
  int workers = 2;                           ///< batch-assembly workers
  std::size_t prefetch = 4;                  ///< prefetch depth
  std::uint64_t shuffle = kW1ShuffleBuffer;  ///< buffer shuffle slots
  std::uint64_t batch = kW1BatchSize;        ///< batch size
  std::uint64_t seed = 1234;
  /// > 0: add a per-sample map that runs this many rounds of a byte loop (see heavy_map).
  int map_rounds = 0;
};

/// records → shuffle(buffer) → [map] → batch → prefetch, on the files matching `glob`.
Pipeline w1_pipeline(const std::string& glob, const W1Options& options = {});

/// The map-heavy transform: `rounds` passes of a dependent multiply-add over the sample's
/// bytes, written back into the sample so it cannot be optimized away: a chain of one xor and
/// one multiply per byte, about 4 cycles per byte (1.4 µs per pass over 1 KiB at 3 GHz; more
/// on a loaded machine). map_cost_ns measures it.
void heavy_map(Sample& sample, int rounds);

/// Measured cost of heavy_map on one `record_bytes` sample, in nanoseconds (median of runs).
double map_cost_ns(std::size_t record_bytes, int rounds);

}  // namespace flowstate::bench
