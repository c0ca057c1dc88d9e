// Shared test helpers: temporary directories, generated record files, and the save/restore
// oracle of STYLE.md as a GoogleTest expectation (the oracle itself, BatchTrace and drain are
// the library's: graph/testing.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "flowstate/core/coordinator.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/testing.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate::testing {

/// A fresh directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Writes `records` records of `record_bytes` bytes into `shards` files named
/// part-00000.bin, ... under `dir`: the synthetic records of nodes/sources/records.h
/// (write_synthetic_records). Record i (global index) starts with i as a little-endian
/// uint64 (truncated to record_bytes), the rest deterministic bytes from (seed, i).
/// Returns the glob matching the files.
std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards, std::uint64_t seed = 7);

/// The global index stored at the start of a record of at least 8 bytes.
std::uint64_t record_index(const std::byte* record);

/// The save/restore oracle of graph/testing.h (check_save_restore), as a GoogleTest
/// expectation: fails the test with the report's summary (every failed breakpoint and its
/// first differing batch) unless every breakpoint reproduced the uninterrupted run.
void expect_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                         LoaderOptions restore_options);

/// The ranks of a job as threads of this process: a Coordinator per rank (core/coordinator.h).
class ThreadGroup {
 public:
  explicit ThreadGroup(std::uint64_t world);
  /// Rank `r`'s coordinator.
  std::shared_ptr<Coordinator> rank(std::uint64_t r);
  /// Runs fn(rank, coordinator) on `world` threads at once; returns each rank's error text
  /// ("" when it returned normally).
  std::vector<std::string> run(
      const std::function<void(std::uint64_t rank, std::shared_ptr<Coordinator>)>& fn);

  struct Shared;  ///< the rendezvous (testing.cpp)

 private:
  std::shared_ptr<Shared> shared_;
  std::uint64_t world_;
};

/// How many calls of a callback (a map, a predicate) overlap in time. With `wait_for_company`
/// the first call waits, up to 10 s, until a second call overlaps it: on a loaded machine that
/// is slow to schedule a second thread, code that allows parallel calls still shows it, and
/// code that calls one at a time never does (its first call then pays the 10 s).
class ConcurrencyProbe {
 public:
  explicit ConcurrencyProbe(bool wait_for_company) : wait_(wait_for_company) {}
  /// Marks one call, `work` long (sleeping).
  void call(std::chrono::microseconds work);
  /// The most calls seen at once.
  int most() const { return most_.load(); }

 private:
  bool wait_;
  std::atomic<bool> met_{false};
  std::atomic<int> now_{0}, most_{0};
};

/// Whether some process holds the copy `key` of the object cache in `cache_dir` pinned (a
/// shared flock on objects/<key>.obj; nodes/sources/object_cache.h). Probes as the cache's own
/// eviction does, with an exclusive flock under the cache's lock: a look-up, always under that
/// lock, never meets the probe's exclusive flock and takes it for an eviction in progress.
bool cache_copy_pinned(const std::filesystem::path& cache_dir, const std::string& key);

/// A remote object no request reaches: its URL names example.invalid, its fetch URL a closed
/// port of 127.0.0.1 (a download fails at once). `size` bytes, ETag "e-NAME".
RemoteObject unreachable_object(const std::string& name, std::uint64_t size);

/// Remote settings that fail fast: one attempt, a 500 ms timeout, 2 connections.
RemoteSettings fast_failing_remote();

}  // namespace flowstate::testing
