// On-disk checkpoints (DESIGN.md §6). A checkpoint directory holds:
//
//   <dir>/step-000000000100/state.bin       the encoded PipelineState
//   <dir>/step-000000000100/MANIFEST.json   format version, fingerprint, step, files, sizes,
//                                           checksums
//   <dir>/LATEST                            a hint: the name of the last checkpoint written
//   <dir>/blobs/0123456789abcdef.blob       a large part of states (a data identity) stored
//                                           once for every step that holds it
//
// A state's blobs (core/state_blob.h) of at least 4 KiB are stored in blobs/, named by their
// XXH3-64, before the state that refers to them; the step's state then holds a 32-byte
// reference instead, and reading the checkpoint puts the blob back: readers get the state as
// it was written, byte for byte. Blobs no step refers to go when steps do (pruning, removal).
//
// `step-N` holds the state after N batches of the schedule were consumed: its last delivered
// batch has step N-1 and a resume continues with step N.
//
// Which checkpoint a resume takes: the newest step-N directory that verifies; LATEST is only
// a hint (for people and tools), never consulted to choose.
//
// Writing costs three fsyncs: step-N.tmp/ → write state.bin and MANIFEST.json → fsync each
// (1, 2) → rename to step-N/ → fsync the parent (3): the commit point. Then LATEST is replaced
// (tmp + rename) without an fsync, and `keep` prunes older checkpoints without one: after a
// power loss LATEST may be stale and a pruned checkpoint may come back, both harmless under
// the newest-valid rule. The new directory's entries are not fsynced on their own: on Linux's
// journaling file systems (ext4, xfs, btrfs) the fsync of a newly created file also makes its
// name durable. A directory without a valid manifest does not exist; stale *.tmp directories
// are ignored by readers and removed by the next write. Replacing an existing step-N renames
// the old one to step-N.old (still a valid fallback) before the new one goes in; both renames
// share the parent's fsync. Writers serialize on an flock of `<dir>/.lock`.
//
// A checkpoint of many ranks (write_group_checkpoint) is one step-N holding every rank's part:
//
//   <dir>/step-000000000100/rank-00000.bin ... rank-00003.bin   each rank's PipelineState
//   <dir>/step-000000000100/MANIFEST.json                       format version 2: world and
//                                                               every part's size and checksum
//
// Every rank writes and fsyncs its part into step-N.tmp/; a collective says whether all
// succeeded; then rank 0 alone writes the manifest and renames step-N.tmp to step-N (the
// commit, as above). A rank that dies at any moment leaves step-N.tmp debris and the previous
// step committed. Restoring is collective too (find_group_checkpoint): the ranks agree on the
// newest step that every one of them can verify.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/core/coordinator.h"
#include "flowstate/serialization/atomic_file.h"

namespace flowstate {

/// How write_checkpoint behaves.
struct CheckpointWriteOptions {
  /// Complete checkpoints to keep after this one is committed (the newest ones); 0 keeps all.
  std::size_t keep = 0;
  /// Write even when `dir` holds a checkpoint that verifies with a higher step than this one.
  /// Off (the default), such a write is refused with CheckpointError ("'dir' holds checkpoints
  /// up to step M; ...") and changes nothing: the directory belongs to a run further along,
  /// whose newest checkpoint a resume would take instead of this one. A write of the same
  /// step, or below checkpoints that do not verify, is never refused.
  bool overwrite = false;
  /// Test hook, called at each phase of the write with its name: "tmp-created",
  /// "state-written" (state.bin written and fsynced), "manifest-written" (the same),
  /// ("moved-aside" when step N already exists and is being replaced; not fsynced),
  /// "renamed" (step-N in place and the parent fsynced: the commit), "latest-written" (not
  /// fsynced). May block or throw; a throw before "renamed" leaves the directory as it was.
  std::function<void(std::string_view phase)> hook;
};

/// What a verified checkpoint holds.
struct CheckpointFound {
  std::string path;        ///< the step-N directory (step-N.old when a replacement was interrupted)
  std::uint64_t step = 0;  ///< N
  std::string state;       ///< contents of state.bin, or of this rank's part (verified)
  std::uint64_t world = 1;           ///< ranks that wrote it (1: a single-process checkpoint)
  std::vector<std::string> skipped;  ///< newer checkpoints that failed to verify: "path: reason"
};

/// Writes `state` (an encoded PipelineState) as checkpoint `step` under `dir` (created if
/// needed). Returns the committed directory. Throws CheckpointError naming the file on any
/// I/O failure; a failed write never replaces or removes a good checkpoint.
std::string write_checkpoint(const std::string& dir, std::uint64_t step, std::string_view state,
                             const CheckpointWriteOptions& options = {});

/// Reads and verifies one step-N directory (manifest present and well-formed, the state's
/// size and checksum as listed). Returns the state bytes — of a checkpoint of many ranks, the
/// part of rank `rank`, or rank 0's when it had fewer ranks (the elastic layout's parts are
/// all alike; any other layout's fingerprint then refuses it) — and throws CheckpointError
/// naming the file and what is wrong. Every other part must be present with its size.
CheckpointFound read_checkpoint(const std::string& checkpoint_dir, std::uint64_t rank = 0);

/// Writes this rank's `state` as its part of checkpoint `step` of all of `coordinator`'s ranks
/// (see the file comment); collective. Returns the committed directory on every rank, or
/// throws the same CheckpointError on every rank (naming the rank that failed) and commits
/// nothing. `dir` must be one directory shared by every rank: a part that rank 0 cannot see
/// is refused. `options` as for write_checkpoint; only rank 0 prunes. `options.hook` also sees
/// "part-written" (this rank's part fsynced) on every rank.
std::string write_group_checkpoint(const std::string& dir, std::uint64_t step,
                                   std::string_view state, Coordinator& coordinator,
                                   const CheckpointWriteOptions& options = {});

/// The newest checkpoint under `dir` whose part every rank of `coordinator` verifies, with this
/// rank's part (see read_checkpoint); collective. nullopt on every rank when no rank sees any
/// evidence of checkpoints; the same CheckpointError on every rank when some do but no step
/// verifies on all of them. `skipped` lists the newer steps passed over, with reasons.
std::optional<CheckpointFound> find_group_checkpoint(const std::string& dir,
                                                     Coordinator& coordinator);

/// Runs every rank's outcome through `coordinator` (collective): returns normally when no
/// rank's `error` is set, else throws on every rank a CheckpointError on `where` whose message
/// is the lowest failing rank's, prefixed "rank K: ".
void agree(Coordinator& coordinator, const std::optional<std::string>& error,
           const std::string& where);

/// Holds `dir` (created if needed) for a run's lifetime: a RunLock on `dir`/.run.lock that the
/// kernel releases when the process dies. Throws CheckpointError naming the holder's pid when
/// another run holds it. With `coordinator` (ranks sharing `dir`) it is the job's: rank 0 takes
/// it, and every rank throws the same CheckpointError when it cannot (collective); the other
/// ranks get nullopt. Ranks with directories of their own each pass null.
std::optional<RunLock> hold_checkpoint_directory(const std::string& dir,
                                                 Coordinator* coordinator = nullptr);

/// The newest checkpoint under `dir` that verifies: every step-N directory from the highest N
/// down (LATEST is only a hint and never chooses). Lists the ones skipped and why (and a
/// LATEST that is garbage or names nothing). nullopt when none verifies (or `dir` does not
/// exist).
std::optional<CheckpointFound> find_latest_checkpoint(const std::string& dir);

/// What shows that checkpoints were written under a directory, valid or not.
struct CheckpointEvidence {
  /// "path: what it is / why it is no checkpoint" for LATEST (and LATEST.tmp), every step-N,
  /// step-N.old and *.tmp entry; LATEST first, then the steps from the highest down.
  std::vector<std::string> entries;
  /// The highest step among them (step directories, and the step LATEST names).
  std::optional<std::uint64_t> highest_step;
  bool empty() const { return entries.empty(); }
};

/// The evidence of checkpoints under `dir` (empty when `dir` is missing, empty, or holds
/// only unrelated files and the writers' `.lock`). Verifies every step directory. Throws
/// CheckpointError when `dir` cannot be listed.
CheckpointEvidence find_checkpoint_evidence(const std::string& dir);

/// Removes every checkpoint under `dir` (step directories, their .old and .tmp forms, LATEST,
/// the blobs and the saved remote listings)
/// under the writers' lock, oldest first, and fsyncs `dir`: a crash part-way leaves the
/// newest ones, never a hole. Other files are left alone. A missing `dir` is not an error.
void remove_checkpoints(const std::string& dir);

}  // namespace flowstate
