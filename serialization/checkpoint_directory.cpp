// The on-disk checkpoint directory of one process: the commit of a step (StepCommit, which
// write_group_checkpoint shares), clean-up after a writer died, pruning, reading and verifying
// one step-N, choosing the newest that verifies, the evidence of checkpoints, and removal.
// The names and the manifest are in checkpoint_manifest.cpp, many ranks in
// checkpoint_group.cpp (checkpoint_internal.h lists what they share).
#include "flowstate/serialization/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/serialization/atomic_file.h"
#include "flowstate/serialization/checkpoint_internal.h"
#include "flowstate/serialization/pipeline_state.h"

// On-disk invariants (see checkpoint.h):
//  - `step-N/` with a MANIFEST.json that verifies is a checkpoint; nothing else is.
//  - `step-N.old/` is a complete checkpoint moved aside while step-N is being replaced; it is
//    a valid fallback for step N until the new step-N is in place, then it is removed.
//  - `*.tmp` entries are work in progress of a writer, or debris of one that died; readers
//    ignore them and the next writer (holding `.lock`) removes them.
//  - Only a writer holding the exclusive lock on `<dir>/.lock` changes the directory, so a
//    writer's clean-up can never remove another live writer's files.
namespace flowstate {

namespace fs = std::filesystem;

namespace checkpoint_detail {
namespace {

// ---- reading ----

/// A directory opened once, so that every file of a checkpoint is read from the same
/// directory even if the name is renamed (replaced) meanwhile.
class OpenDir {
 public:
  explicit OpenDir(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ >= 0) return;
    if (errno == ENOENT) throw CheckpointError(path, quote(path) + " does not exist");
    if (errno == ENOTDIR) throw CheckpointError(path, quote(path) + " is not a directory");
    throw CheckpointError(path, "cannot open " + quote(path) + ": " + std::strerror(errno));
  }
  ~OpenDir() { ::close(fd_); }
  OpenDir(const OpenDir&) = delete;
  OpenDir& operator=(const OpenDir&) = delete;

  /// Checks that file `name` is a regular file of `expected` bytes, without reading it.
  void read_size(std::string_view name, std::uint64_t expected) const {
    const std::string path = join(path_, name);
    struct stat st {};
    if (::fstatat(fd_, std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) throw CheckpointError(path, quote(path) + " is missing");
      throw CheckpointError(path, "cannot stat " + quote(path) + ": " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) throw CheckpointError(path, quote(path) + " is not a regular file");
    if (static_cast<std::uint64_t>(st.st_size) != expected)
      throw CheckpointError(path, quote(path) + " has " + std::to_string(st.st_size) +
                                      " bytes, the manifest lists " + std::to_string(expected));
  }

  /// Reads file `name`. With `expected` set, its size must be exactly that; otherwise at most
  /// `max_bytes`.
  std::string read(std::string_view name, std::optional<std::uint64_t> expected,
                   std::size_t max_bytes, std::string_view missing_hint) const {
    const std::string path = join(path_, name);
    int fd = ::openat(fd_, std::string(name).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT)
        throw CheckpointError(path, quote(path) + " is missing" + std::string(missing_hint));
      throw CheckpointError(path, "cannot open " + quote(path) + ": " + std::strerror(errno));
    }
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      throw CheckpointError(path, "cannot stat " + quote(path) + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw CheckpointError(path, quote(path) + " is not a regular file");
    const auto actual = static_cast<std::uint64_t>(st.st_size);
    if (expected && actual < *expected)
      throw CheckpointError(path, quote(path) + " is truncated: it has " + std::to_string(actual) +
                                      " bytes, the manifest lists " + std::to_string(*expected));
    if (expected && actual > *expected)
      throw CheckpointError(path, quote(path) + " has " + std::to_string(actual) +
                                      " bytes, the manifest lists " + std::to_string(*expected));
    if (!expected && actual > max_bytes)
      throw CheckpointError(path, quote(path) + " is too large (" + std::to_string(actual) +
                                      " bytes; at most " + std::to_string(max_bytes) + ")");
    std::string out(static_cast<std::size_t>(actual), '\0');
    std::size_t got = 0;
    while (got < out.size()) {
      ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw CheckpointError(path, "cannot read " + quote(path) + ": " + std::strerror(errno));
      if (n == 0)
        throw CheckpointError(path, quote(path) + " is truncated: it shrank while being read");
      got += static_cast<std::size_t>(n);
    }
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

/// Reads LATEST and returns the step directory name it holds.
std::string read_latest(const std::string& latest) {
  std::string text = read_small_file(latest, kMaxLatestBytes);
  std::string name = text;
  if (name.ends_with('\n')) name.pop_back();
  auto parsed = parse_step_name(name);
  if (!parsed || parsed->aside)
    throw CheckpointError(
        latest, quote(latest) + " does not name a checkpoint: \"" + printable(text) + "\"");
  return name;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

bool verifies(const std::string& path) {
  try {
    read_checkpoint(path);
    return true;
  } catch (const CheckpointError&) {
    return false;
  }
}

/// Keeps `keep` verified checkpoints counting the one just committed at `step`; removes the
/// older ones beyond them. Checkpoints with a higher step (from a run that was resumed from
/// an earlier point) are neither counted nor removed: re-checkpointing replaces them.
bool prune(const std::string& dir, std::uint64_t step, std::size_t keep) {
  std::size_t kept = 1;
  bool removed = false;
  for (const auto& c : list_candidates(dir)) {
    if (c.name.aside || c.name.step >= step) continue;
    if (kept < keep && verifies(c.path)) {
      ++kept;
      continue;
    }
    // Out of the readers' sight first, so a crash never leaves a half-removed step-N.
    const std::string doomed = c.path + ".prune" + std::string(kTmpSuffix);
    rename_path(c.path, doomed);
    remove_tree(doomed);
    removed = true;
  }
  // No fsync: a pruned checkpoint that comes back after a power loss is an older valid one,
  // which the newest-valid rule passes over and the next prune removes.
  return removed;
}

}  // namespace

std::vector<Candidate> list_candidates(const std::string& dir) {
  std::vector<Candidate> out;
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      auto name = parse_step_name(entry.path().filename().string());
      std::error_code ec;
      if (name && entry.is_directory(ec)) out.push_back({*name, entry.path().string()});
    }
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(dir, "cannot list " + quote(dir) + ": " + e.code().message());
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.name.step != b.name.step) return a.name.step > b.name.step;
    return !a.name.aside && b.name.aside;
  });
  return out;
}

void clean_up(const std::string& dir) {
  std::vector<std::string> debris, asides;
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name.ends_with(kTmpSuffix)) {
        debris.push_back(entry.path().string());
      } else if (auto s = parse_step_name(name); s && s->aside) {
        asides.push_back(entry.path().string());
      }
    }
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(dir, "cannot list " + quote(dir) + ": " + e.code().message());
  }
  bool changed = !debris.empty();
  for (const auto& path : debris) remove_tree(path);
  // A blob write a dead writer left unfinished (no other writer runs: we hold the lock).
  std::error_code ec;
  if (fs::is_directory(join(dir, kBlobsDir), ec))
    for (const auto& entry : fs::directory_iterator(join(dir, kBlobsDir), ec))
      if (entry.path().filename().string().ends_with(kTmpSuffix))
        remove_tree(entry.path().string());
  for (const auto& aside : asides) {
    const std::string replaced = aside.substr(0, aside.size() - kAsideSuffix.size());
    if (!verifies(replaced)) {
      remove_tree(replaced);
      rename_path(aside, replaced);
    } else {
      remove_tree(aside);
    }
    changed = true;
  }
  if (changed) fsync_directory(dir);
}

std::optional<std::string> latest_problem(const std::string& dir) {
  const std::string latest = join(dir, kLatestFile);
  if (!exists(latest)) return std::nullopt;
  try {
    const std::string target = join(dir, read_latest(latest));
    if (exists(target) || exists(target + std::string(kAsideSuffix))) return std::nullopt;
    return latest + ": " + quote(latest) + " names " + quote(target) + ", which does not exist";
  } catch (const CheckpointError& e) {
    return latest + ": " + e.what();
  }
}

void refuse_if_behind(const std::string& dir, std::uint64_t step) {
  for (const auto& c : list_candidates(dir)) {
    if (c.name.step <= step) break;  // newest first
    if (c.name.aside || !verifies(c.path)) continue;
    throw CheckpointError(dir, quote(dir) + " holds checkpoints up to step " +
                                   std::to_string(c.name.step) + ", newer than this one (step " +
                                   std::to_string(step) +
                                   "); restore from it to continue that run, or write with "
                                   "overwrite to put an older step under it");
  }
}

void StepCommit::commit(const Manifest& manifest) {
  write_file_durably(join(tmp_, kManifestFile), encode_manifest(manifest));
  phase_("manifest-written");
  if (exists(final_dir_)) {
    // Re-checkpointing a step (after a resume): the old copy stays valid, under a name
    // readers fall back to, until the new one is in place. Both renames share the fsync
    // below; a journaling file system makes them durable in order.
    rename_path(final_dir_, aside_);
    moved_aside_ = true;
    phase_("moved-aside");
  }
  rename_path(tmp_, final_dir_);
  renamed_ = true;
  fsync_directory(dir_);  // the commit
}

void StepCommit::roll_back() noexcept {
  try {
    // When only the fsync failed, the checkpoint is in place but maybe not on disk: take it
    // back out, so that what readers see agrees with the error.
    if (renamed_) rename_path(final_dir_, tmp_);
    if (moved_aside_) rename_path(aside_, final_dir_);
    remove_tree(tmp_);
    fsync_directory(dir_);
  } catch (...) {
  }
}

void StepCommit::finish(std::uint64_t step, std::size_t keep) {
  phase_("renamed");
  try {
    replace_file_atomically(join(dir_, kLatestFile), name_ + "\n", Durability::kHint);
  } catch (const CheckpointError&) {
  }
  phase_("latest-written");
  if (moved_aside_) remove_tree(aside_);
  const bool pruned = keep > 0 && prune(dir_, step, keep);
  // Blobs are shared by steps: only a step removed can leave one unreferenced.
  if (pruned || moved_aside_) collect_blobs(dir_);
}

}  // namespace checkpoint_detail

using namespace checkpoint_detail;

std::string write_checkpoint(const std::string& dir, std::uint64_t step, std::string_view state,
                             const CheckpointWriteOptions& options) {
  // Never commit bytes that could not be restored; the manifest records their fingerprint.
  const PipelineState decoded = PipelineState::decode(state, "state");
  auto phase = [&](std::string_view name) {
    if (options.hook) options.hook(name);
  };

  create_directories_durably(dir);
  DirectoryLock lock(join(dir, kLockFile));
  clean_up(dir);
  if (!options.overwrite) refuse_if_behind(dir, step);

  StepCommit commit(dir, step, phase);
  const std::string& tmp = commit.tmp();
  try {
    // No fsync of `dir` for the new entry: until the rename below, it is debris anyway.
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw CheckpointError(tmp,
                            "cannot create directory " + quote(tmp) + ": " + std::strerror(errno));
    phase("tmp-created");
    // Large blobs (data identities) once per directory, on disk before the state naming them.
    const StoredState stored = externalize_blobs(state);
    write_blobs(dir, stored);
    write_file_durably(join(tmp, kStateFile), stored.bytes);  // fsync 1
    phase("state-written");
    // fsync 2 (the manifest) and 3 (the parent: the commit).
    commit.commit(Manifest{step,
                           decoded.fingerprint,
                           0,
                           {{std::string(kStateFile), stored.bytes.size(), hash64(stored.bytes)}}});
  } catch (...) {
    commit.roll_back();
    throw;
  }
  commit.finish(step, options.keep);
  return commit.final_dir();
}

CheckpointFound read_checkpoint(const std::string& checkpoint_dir, std::uint64_t rank) {
  fs::path p(checkpoint_dir);
  if (!p.has_filename()) p = p.parent_path();  // "…/step-N/"
  const std::string dir = p.string();
  auto name = parse_step_name(p.filename().string());
  if (!name)
    throw CheckpointError(dir, quote(dir) +
                                   " is not a checkpoint directory: its name is not "
                                   "step-NNNNNNNNNNNN");
  OpenDir d(dir);
  const std::string manifest_path = join(dir, kManifestFile);
  const Manifest m = parse_manifest(
      d.read(kManifestFile, std::nullopt, kMaxManifestBytes, ": the checkpoint is incomplete"),
      manifest_path);
  if (m.step != name->step)
    throw CheckpointError(manifest_path, quote(manifest_path) + " is for step " +
                                             std::to_string(m.step) + ", but " + quote(dir) +
                                             " is named for step " + std::to_string(name->step));
  CheckpointFound found;
  found.path = dir;
  found.step = m.step;
  found.world = std::max<std::uint64_t>(m.world, 1);
  // Of many ranks' parts this rank reads its own (rank 0's when the checkpoint had fewer
  // ranks); the others must be there, with their sizes: one commit holds them all.
  const std::string mine =
      m.world == 0 ? std::string(kStateFile) : part_name(rank < m.world ? rank : 0);
  for (const auto& f : m.files) {
    const std::string path = join(dir, f.name);
    if (f.name != mine) {
      d.read_size(f.name, f.size);
      continue;
    }
    std::string bytes = d.read(f.name, f.size, 0, "");
    const std::uint64_t sum = hash64(bytes);
    if (sum != f.checksum)
      throw CheckpointError(path, quote(path) + " is corrupt: its XXH3-64 checksum is " +
                                      hex64(sum) + ", the manifest lists " + hex64(f.checksum));
    found.state = std::move(bytes);
  }
  // The bytes are what was written; decoding also catches a state this build cannot read.
  const std::string state_path = join(dir, mine);
  found.state = internalize_blobs(
      found.state, p.has_parent_path() ? p.parent_path().string() : std::string("."), state_path);
  const PipelineState s = PipelineState::decode(found.state, state_path);
  if (m.world == 0 && s.fingerprint != m.fingerprint)
    throw CheckpointError(manifest_path, quote(manifest_path) + " lists fingerprint " +
                                             hex64(m.fingerprint) + ", but " + quote(state_path) +
                                             " holds " + hex64(s.fingerprint));
  return found;
}

std::optional<CheckpointFound> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  std::vector<std::string> skipped;
  // LATEST is only a hint: it never chooses, but a damaged one is worth a word.
  if (auto problem = latest_problem(dir)) skipped.push_back(*problem);
  for (const auto& c : list_candidates(dir)) {
    try {
      CheckpointFound found = read_checkpoint(c.path);
      found.skipped = skipped;
      return found;
    } catch (const CheckpointError& e) {
      skipped.push_back(c.path + ": " + e.what());
    }
  }
  return std::nullopt;
}

CheckpointEvidence find_checkpoint_evidence(const std::string& dir) {
  CheckpointEvidence out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  auto raise = [&](std::uint64_t step) {
    out.highest_step = std::max(out.highest_step.value_or(0), step);
  };
  const std::string latest = join(dir, kLatestFile);
  if (exists(latest)) {
    std::string what = latest + ": ";
    try {
      const std::string target = read_latest(latest);
      raise(parse_step_name(target)->step);
      what += quote(latest) + " names " + quote(join(dir, target));
      if (!exists(join(dir, target))) what += ", which does not exist";
    } catch (const CheckpointError& e) {
      what += e.what();
    }
    out.entries.push_back(what);
  }
  if (exists(latest + std::string(kTmpSuffix)))
    out.entries.push_back(latest + std::string(kTmpSuffix) + ": " +
                          quote(latest + std::string(kTmpSuffix)) +
                          " is an unfinished write of LATEST");
  // Step directories (and their .old and .tmp forms), highest step first.
  std::vector<std::pair<std::uint64_t, std::string>> steps;
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      const std::string path = entry.path().string();
      std::string_view base = name;
      const bool tmp = base.ends_with(kTmpSuffix);
      if (tmp) base = base.substr(0, base.find('.'));  // step-N.tmp, step-N.prune.tmp, ...
      auto parsed = parse_step_name(base);
      if (!parsed) continue;
      raise(parsed->step);
      std::string what = path + ": ";
      if (tmp) {
        what += quote(path) + " is an unfinished checkpoint write or removal";
      } else {
        try {
          read_checkpoint(path);
          what += "verifies";
        } catch (const CheckpointError& e) {
          what += e.what();
        }
      }
      steps.emplace_back(parsed->step, what);
    }
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(dir, "cannot list " + quote(dir) + ": " + e.code().message());
  }
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (auto& [step, what] : steps) out.entries.push_back(std::move(what));
  return out;
}

void remove_checkpoints(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  DirectoryLock lock(join(dir, kLockFile));
  std::vector<std::pair<std::uint64_t, std::string>> doomed;
  try {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      std::string_view base = name;
      if (base.ends_with(kTmpSuffix)) base = base.substr(0, base.find('.'));
      if (auto parsed = parse_step_name(base)) doomed.emplace_back(parsed->step, entry.path());
    }
  } catch (const fs::filesystem_error& e) {
    throw CheckpointError(dir, "cannot list " + quote(dir) + ": " + e.code().message());
  }
  // Oldest first: a crash part-way leaves the newest checkpoints, never a hole below them.
  std::sort(doomed.begin(), doomed.end());
  for (const auto& [step, path] : doomed) remove_tree(path);
  remove_tree(join(dir, kBlobsDir));
  remove_tree(join(dir, kListingsDir));  // a fresh run lists the objects again
  remove_tree(join(dir, kLatestFile));
  remove_tree(join(dir, std::string(kLatestFile) + std::string(kTmpSuffix)));
  fsync_directory(dir);
}

}  // namespace flowstate
