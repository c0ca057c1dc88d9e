// The bodies of the libFuzzer targets, shared with the regression test that replays every
// input under fuzz/regressions/<target>/. An input may make flowstate throw a
// flowstate::Error — that is the contract for bad input — but never anything else, never
// crash, never hang.
//
// Adding a target: a function or class here (its body in fuzz_targets.cpp), a
// `<name>_fuzzer.cpp` calling it, the name in fuzz/CMakeLists.txt and in fuzz/run.sh's
// `all_targets`, seeds in fuzz/corpus/<name>/, and a replay test in
// tests/fuzz/fuzz_regressions_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flowstate::fuzz {

/// A fresh directory under the system's temporary directory, removed with everything in it
/// when destroyed. Throws std::runtime_error when it cannot be created.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Writes `bytes` to the file `name` in the directory (replacing it); returns its path.
  /// Throws std::runtime_error when the write fails.
  std::string write(const std::string& name, std::string_view bytes) const;

 private:
  std::filesystem::path path_;
};

/// The bytes of a fuzzer's input, as a string_view.
inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Loads `data` as a YAML pipeline (with overrides taken from its lines that start with
/// "#set " — so the fuzzer reaches the override parser too). Builds the pipeline; opens no
/// file. Swallows flowstate::Error; anything else escapes.
void yaml_one_input(const std::uint8_t* data, std::size_t size);

/// Restores `data` as an encoded PipelineState into a Loader of a tiny pipeline
/// (records → shard → global shuffle → buffer shuffle → batch, on files it generates), then
/// pulls a few batches. Swallows flowstate::Error; anything else escapes.
class StateTarget {
 public:
  /// Generates the pipeline's data under a fresh temporary directory.
  StateTarget();
  ~StateTarget();
  StateTarget(const StateTarget&) = delete;
  StateTarget& operator=(const StateTarget&) = delete;

  /// Returns true when the pipeline accepted the input as its state.
  bool one_input(const std::uint8_t* data, std::size_t size);
  /// Valid states of the pipeline (after several numbers of batches, with skipped ranges),
  /// a seed corpus.
  std::vector<std::string> seeds();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes `data` as a tar file in `dir` (its index cache removed first, so the index is built
/// from these bytes) and opens it with a `tar` source four ways — every extension as a field,
/// then fields {tokens, cls} with on_missing error and skip, then every extension again, the
/// last three reading the cache the first wrote — reading every sample's fields, raw bytes
/// and key. A finding when the source read from the cache disagrees with the
/// one that built it (throws std::logic_error). Swallows flowstate::Error; anything else
/// escapes.
void tar_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size);

/// Writes `data` as a text file in `dir` (its index cache removed first) and reads every line
/// with a `lines` source as text, as JSON Lines, and as JSON Lines with json_fields
/// {id, tokens}, each with skip_empty off and on. A line that is bad JSON is a DataError
/// and the next line is read still. Throws std::logic_error when a source reading a cached
/// index sees other lines than the one that built it. Swallows flowstate::Error; anything
/// else escapes.
void lines_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size);

/// With FLOWSTATE_FUZZ_WRITE_SEEDS=DIR set (fuzz/run.sh sets it), writes `seeds` into DIR as
/// seed-0, seed-1, ...: the seed corpus of a target whose valid inputs it makes itself.
void write_seeds_if_asked(const std::vector<std::string>& seeds);

/// A Megatron indexed data set from one input: its first 2 bytes (little-endian) are the
/// length L of the `.idx` (capped at what remains), the next L bytes the `.idx`, the rest the
/// `.bin`. Opens it with an `indexed` source as documents and as sequences and reads every
/// record. Swallows flowstate::Error; anything else escapes.
void megatron_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size);

/// The index caches (nodes/sources/index_cache.h) of a small fixed text file and tar file,
/// whose mtimes are pinned so that a cache written for them once stays valid for them. The
/// input's first byte picks the index kind — `lines/2`, `lines/2 skip_empty` or `tar/1` —
/// and the mode:
///   - raw (bit 2 clear): the rest of the input is the `<file>.fsidx`, byte for byte: the
///     cache's own checks (identity, counts, checksum) are fuzzed;
///   - payload (bit 2 set): the rest is an index — entries, then the string table — written
///     as a valid cache by load_index itself: the sources' checks of what a cache says are
///     fuzzed, as a cache crafted to pass the checksum would test them.
/// Then the file is opened with the source of that kind and every record read.
class IndexTarget {
 public:
  /// Writes the data files under a fresh temporary directory.
  IndexTarget();
  ~IndexTarget();
  IndexTarget(const IndexTarget&) = delete;
  IndexTarget& operator=(const IndexTarget&) = delete;

  /// Returns true when the source opened and read every record; false when it threw a
  /// flowstate::Error (bad input). Anything else escapes.
  bool one_input(const std::uint8_t* data, std::size_t size);
  /// Valid inputs: for each kind, the cache the source writes in raw mode and its index in
  /// payload mode; a seed corpus.
  std::vector<std::string> seeds();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowstate::fuzz
