// Internal to the checkpoint protocol (not installed): what its three files share. The API is
// checkpoint.h; the protocol is split by concern:
//   checkpoint_manifest.cpp   the names on disk (step-N, rank-K.bin) and the MANIFEST.json codec
//   checkpoint_directory.cpp  the directory: the commit of a step (StepCommit), clean-up,
//                             pruning, listing and choosing checkpoints, reading one, removal
//   checkpoint_group.cpp      the commit and the restore of many ranks through a Coordinator
// Both writers (write_checkpoint, write_group_checkpoint) commit through the same StepCommit
// and clean up with the same clean_up, so their crash guarantees are the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowstate::checkpoint_detail {

/// Version 1: one process's state.bin. Version 2: a checkpoint of many ranks (rank-K.bin).
constexpr std::uint64_t kFormatVersion = 2;
constexpr std::string_view kFormatName = "flowstate-checkpoint";
constexpr std::string_view kStateFile = "state.bin";
constexpr std::string_view kManifestFile = "MANIFEST.json";
constexpr std::string_view kLatestFile = "LATEST";
constexpr std::string_view kLockFile = ".lock";
/// The run lock (RunLock): held by the run that checkpoints into the directory, for its lifetime.
constexpr std::string_view kRunLockFile = ".run.lock";
constexpr std::string_view kTmpSuffix = ".tmp";
constexpr std::string_view kAsideSuffix = ".old";
/// The directory of the blobs shared by a checkpoint directory's steps (checkpoint_blobs.cpp).
constexpr std::string_view kBlobsDir = "blobs";
constexpr std::string_view kBlobSuffix = ".blob";
/// The directory of the remote listings a job saved beside its checkpoints (kListingsDir of
/// nodes/sources/remote_listing.h, which this library does not see): removed with them.
constexpr std::string_view kListingsDir = "listings";
/// The first bytes of a stored state holding blob references (a state begins "FLWSTATE").
constexpr std::string_view kStoredWithReferences = "FLWSREFS";
constexpr std::size_t kMaxManifestBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxLatestBytes = 4096;

// ---- names (checkpoint_manifest.cpp) ----

/// `dir`/`name`.
std::string join(const std::string& dir, std::string_view name);

/// 'path', for messages.
std::string quote(const std::string& path);

/// "step-NNNNNNNNNNNN": the directory of checkpoint `step`.
std::string step_name(std::uint64_t step);

/// A directory name under a checkpoint root.
struct StepName {
  std::uint64_t step = 0;
  bool aside = false;  ///< step-N.old
};

/// Parses "step-NNNNNNNNNNNN" or "step-NNNNNNNNNNNN.old"; only the canonical spelling of a
/// step counts, so one step has one name.
std::optional<StepName> parse_step_name(std::string_view name);

/// 16 lowercase hex digits; nullopt for anything else.
std::optional<std::uint64_t> parse_hex64(const std::string& s);

/// Up to 40 characters of `s`, printable, for error messages about garbage.
std::string printable(std::string_view s);

/// "rank-KKKKK.bin": rank `rank`'s part of a checkpoint of many ranks.
std::string part_name(std::uint64_t rank);

// ---- manifest (checkpoint_manifest.cpp) ----

struct ManifestEntry {
  std::string name;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  ///< XXH3-64, seed 0
};

struct Manifest {
  std::uint64_t step = 0;
  std::uint64_t fingerprint = 0;  ///< version 1 only: each part of version 2 holds its own
  std::uint64_t world = 0;        ///< version 2: the ranks that wrote it; 0 for version 1
  std::vector<ManifestEntry> files;
};

/// MANIFEST.json's text: version 1 when `m.world` is 0, else version 2.
std::string encode_manifest(const Manifest& m);

/// Parses and checks MANIFEST.json's `text` (read from `path`, for messages); throws
/// CheckpointError naming `path` and what is wrong.
Manifest parse_manifest(const std::string& text, const std::string& path);

// ---- blobs (checkpoint_blobs.cpp) ----

/// A state as a checkpoint stores it: its large blobs (core/state_blob.h) replaced by
/// references, and those blobs.
struct StoredState {
  std::string bytes;
  /// The file name in blobs/ and the whole inline blob (viewing the state given).
  std::vector<std::pair<std::string, std::string_view>> blobs;
};

/// Replaces every inline blob of at least kMinExternalBlobBytes in `state` by a reference,
/// prefixed by kStoredWithReferences; without any, the bytes are `state`. A state that holds a
/// reference marker already is stored as it is, so reading it back is exact.
StoredState externalize_blobs(std::string_view state);

/// Writes the blobs of `stored` into `dir`/blobs (one already there with its size is kept),
/// durably: each file fsynced and renamed in, then blobs/ fsynced. Throws CheckpointError.
void write_blobs(const std::string& dir, const StoredState& stored);

/// `stored` with each reference replaced by its blob from `dir`/blobs — the state as it was
/// given to the writer. Throws CheckpointError naming the blob file when it is missing or is
/// not the blob referred to, and `origin` (the state file) as the one that refers to it.
std::string internalize_blobs(std::string_view stored, const std::string& dir,
                              const std::string& origin);

/// Removes the blobs no step directory under `dir` refers to, and blob debris (*.tmp). The
/// caller holds the writers' lock. Errors leave blobs in place (collected next time).
void collect_blobs(const std::string& dir);

// ---- the directory (checkpoint_directory.cpp) ----

struct Candidate {
  StepName name;
  std::string path;
};

/// The step-N and step-N.old directories under `dir`, newest first (step-N before its aside).
std::vector<Candidate> list_candidates(const std::string& dir);

/// Brings `dir` back to its invariants after a writer died (caller holds the lock): removes
/// `*.tmp` debris, and resolves an interrupted replacement — the new step-N is kept when it
/// verifies, else the old one comes back from step-N.old.
void clean_up(const std::string& dir);

/// What is wrong with LATEST, if anything ("path: reason"): unreadable, garbage, or naming a
/// step directory that is not there (unless a replacement of it was interrupted).
std::optional<std::string> latest_problem(const std::string& dir);

/// Throws when a checkpoint that verifies has a higher step than `step` (caller holds the
/// lock): writing below it would leave a resume on the other run's checkpoint.
void refuse_if_behind(const std::string& dir, std::uint64_t step);

/// The commit of a step written into `step-N.tmp`, shared by write_checkpoint and
/// write_group_checkpoint: the manifest, the old `step-N` moved aside, the rename, the fsync
/// of the parent (the commit); undone on failure; then the hint, the aside copy dropped and
/// pruning. Phases, in order: manifest-written, moved-aside (when replacing), renamed,
/// latest-written.
class StepCommit {
 public:
  using Phase = std::function<void(std::string_view)>;
  StepCommit(std::string dir, std::uint64_t step, Phase phase)
      : dir_(std::move(dir)),
        name_(step_name(step)),
        final_dir_(join(dir_, name_)),
        tmp_(final_dir_ + std::string(kTmpSuffix)),
        aside_(final_dir_ + std::string(kAsideSuffix)),
        phase_(std::move(phase)) {}

  const std::string& final_dir() const { return final_dir_; }
  const std::string& tmp() const { return tmp_; }

  /// Writes `manifest` into the step's tmp directory and commits it. On a throw the caller
  /// calls roll_back().
  void commit(const Manifest& manifest);

  /// Leaves the directory as it was before the write: the old step-N back in place, no
  /// debris. Never throws: what it cannot undo, the next writer's clean_up finishes.
  void roll_back() noexcept;

  /// After a commit: LATEST (a hint only — the newest valid step wins — so no fsync, and a
  /// failure to write it does not fail the committed checkpoint), the aside copy dropped
  /// (debris if it comes back after a power loss), and the oldest steps beyond `keep`.
  void finish(std::uint64_t step, std::size_t keep);

 private:
  std::string dir_, name_, final_dir_, tmp_, aside_;
  Phase phase_;
  bool moved_aside_ = false;
  bool renamed_ = false;
};

}  // namespace flowstate::checkpoint_detail
