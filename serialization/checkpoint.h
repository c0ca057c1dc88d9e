// On-disk checkpoints (DESIGN.md §6). A checkpoint directory holds:
//
//   <dir>/step-000000000100/state.bin       the encoded PipelineState
//   <dir>/step-000000000100/MANIFEST.json   format version, fingerprint, step, files, sizes,
//                                           checksums (written last)
//   <dir>/LATEST                            name of the newest complete checkpoint
//
// `step-N` holds the state after N batches of the schedule were consumed: its last delivered
// batch has step N-1 and a resume continues with step N.
//
// Writing: step-N.tmp/ → write + fsync each file → manifest last + fsync → rename to step-N/
// → fsync the parent → replace LATEST atomically (tmp + rename + fsync). A directory without
// a valid manifest does not exist; stale *.tmp directories are ignored and removed by the
// next write. `keep` prunes older checkpoints only after the new one is committed. Replacing an
// existing step-N renames the old one to step-N.old (still a valid fallback) before the new one
// goes in. Writers serialize on an flock of `<dir>/.lock`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flowstate {

/// How write_checkpoint behaves.
struct CheckpointWriteOptions {
  /// Complete checkpoints to keep after this one is committed (the newest ones); 0 keeps all.
  std::size_t keep = 0;
  /// Test hook, called at each phase of the write with its name: "tmp-created",
  /// "state-written", "manifest-written", ("moved-aside" when step N already exists and is
  /// being replaced), "renamed", "latest-written". May block or throw; a throw before
  /// "renamed" leaves the directory as it was.
  std::function<void(std::string_view phase)> hook;
};

/// What a verified checkpoint holds.
struct CheckpointFound {
  std::string path;        ///< the step-N directory (step-N.old when a replacement was interrupted)
  std::uint64_t step = 0;  ///< N
  std::string state;       ///< contents of state.bin (verified)
  std::vector<std::string> skipped;  ///< newer checkpoints that failed to verify: "path: reason"
};

/// Writes `state` (an encoded PipelineState) as checkpoint `step` under `dir` (created if
/// needed). Returns the committed directory. Throws CheckpointError naming the file on any
/// I/O failure; a failed write never replaces or removes a good checkpoint.
std::string write_checkpoint(const std::string& dir, std::uint64_t step, std::string_view state,
                             const CheckpointWriteOptions& options = {});

/// Reads and verifies one step-N directory (manifest present and well-formed, every file's
/// size and checksum as listed). Returns the state bytes; throws CheckpointError naming the
/// file and what is wrong.
CheckpointFound read_checkpoint(const std::string& checkpoint_dir);

/// The newest checkpoint under `dir` that verifies: LATEST's target first, then every step-N
/// directory from the highest N down. Lists the ones skipped and why. nullopt when none
/// verifies (or `dir` does not exist).
std::optional<CheckpointFound> find_latest_checkpoint(const std::string& dir);

}  // namespace flowstate
