// The bodies of the libFuzzer targets, shared with the regression test that replays every
// input under fuzz/regressions/<target>/. An input may make flowstate throw a
// flowstate::Error — that is the contract for bad input — but never anything else, never
// crash, never hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flowstate::fuzz {

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

}  // namespace flowstate::fuzz
