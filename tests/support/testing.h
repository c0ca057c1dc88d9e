// Shared test helpers: temporary directories, generated record files, and the save/restore
// oracle of STYLE.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "graph/loader.h"

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
/// part-00000.bin, ... under `dir`. Record i (global index) starts with i as a little-endian
/// uint64 (truncated to record_bytes), the rest deterministic bytes from (seed, i).
/// Returns the glob matching the files.
std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards, std::uint64_t seed = 7);

/// The global index stored at the start of a record of at least 8 bytes.
std::uint64_t record_index(const std::byte* record);

/// A compact, comparable trace of one delivered batch.
struct BatchTrace {
  std::uint64_t step, epoch, index_in_epoch;
  bool last;
  std::uint32_t remainder;
  std::uint64_t digest;
  bool operator==(const BatchTrace&) const = default;
};
std::ostream& operator<<(std::ostream& os, const BatchTrace& t);
BatchTrace trace(const Batch& b);

/// Drains `loader` (at most `limit` batches) into traces.
std::vector<BatchTrace> drain(Loader& loader, std::size_t limit = SIZE_MAX);

/// The save/restore oracle (STYLE.md): runs `make()` uninterrupted; then for every
/// breakpoint k, consumes k batches, saves the state, destroys the loader, builds a fresh one
/// (with `restore_options`), loads the state and drains it; the concatenation must equal the
/// uninterrupted run byte for byte. Breakpoints: 0, 1, mid first epoch, the last batch of the
/// first epoch, the epoch's end, mid second epoch, and the end. Uses GoogleTest assertions.
void check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                        LoaderOptions restore_options);

}  // namespace flowstate::testing
