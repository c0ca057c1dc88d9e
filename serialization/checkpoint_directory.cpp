// The on-disk checkpoint protocol — write (one process, or every rank of a job through a
// Coordinator), verify, find the newest valid step, prune, remove — kept in one file (over 600
// lines) so that its crash guarantees can be read in one place: both writers commit through
// the same StepCommit and clean up with the same clean_up, and splitting them would expose
// those internals in a header.
#include "flowstate/serialization/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/version.h"
#include "flowstate/serialization/atomic_file.h"
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
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

/// Version 1: one process's state.bin. Version 2: a checkpoint of many ranks (rank-K.bin).
constexpr std::uint64_t kFormatVersion = 2;
constexpr std::string_view kFormatName = "flowstate-checkpoint";
constexpr std::string_view kStateFile = "state.bin";
constexpr std::string_view kManifestFile = "MANIFEST.json";
constexpr std::string_view kLatestFile = "LATEST";
constexpr std::string_view kLockFile = ".lock";
constexpr std::string_view kTmpSuffix = ".tmp";
constexpr std::string_view kAsideSuffix = ".old";
constexpr std::size_t kMaxManifestBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxLatestBytes = 4096;

std::string join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

std::string quote(const std::string& path) { return "'" + path + "'"; }

std::string step_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012llu", static_cast<unsigned long long>(step));
  return buf;
}

/// A directory name under a checkpoint root.
struct StepName {
  std::uint64_t step = 0;
  bool aside = false;  ///< step-N.old
};

/// Parses "step-NNNNNNNNNNNN" or "step-NNNNNNNNNNNN.old"; only the canonical spelling of a
/// step counts, so one step has one name.
std::optional<StepName> parse_step_name(std::string_view name) {
  StepName out;
  if (name.ends_with(kAsideSuffix)) {
    out.aside = true;
    name.remove_suffix(kAsideSuffix.size());
  }
  if (!name.starts_with("step-")) return std::nullopt;
  std::string_view digits = name.substr(5);
  const char* end = digits.data() + digits.size();
  auto [p, ec] = std::from_chars(digits.data(), end, out.step);
  if (digits.empty() || ec != std::errc() || p != end || step_name(out.step) != name)
    return std::nullopt;
  return out;
}

std::optional<std::uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;  // lowercase only: a flipped case bit is corruption
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  return v;
}

/// Up to 40 characters of `s`, printable, for error messages about garbage.
std::string printable(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 40; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

// ---- manifest ----

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

std::string part_name(std::uint64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05llu.bin", static_cast<unsigned long long>(rank));
  return buf;
}

std::string encode_manifest(const Manifest& m) {
  Json files = Json::array();
  for (const auto& f : m.files)
    files.push_back(Json{{"name", f.name}, {"size", f.size}, {"xxh3_64", hex64(f.checksum)}});
  Json j;
  j["format"] = kFormatName;
  // A single process's checkpoint keeps version 1, which older builds read.
  j["format_version"] = m.world == 0 ? 1 : 2;
  j["step"] = m.step;
  if (m.world == 0)
    j["fingerprint"] = hex64(m.fingerprint);
  else
    j["world"] = m.world;
  j["files"] = std::move(files);
  j["writer"] = std::string("flowstate ") + version();  // for people; never read back
  return j.dump(2) + "\n";
}

/// Checks that `object` has exactly `keys`: a key damaged by a flipped byte is an error, not
/// an ignored extra.
void require_keys(const Json& object, std::initializer_list<std::string_view> keys,
                  const std::string& where, const auto& invalid,
                  std::initializer_list<std::string_view> optional = {}) {
  for (auto k : keys)
    if (!object.contains(std::string(k))) throw invalid(where + "has no '" + std::string(k) + "'");
  for (const auto& item : object.items())
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end() &&
        std::find(optional.begin(), optional.end(), item.key()) == optional.end())
      throw invalid(where + "has an unknown key '" + printable(item.key()) + "'");
}

/// "flowstate 0.1.0": who wrote a manifest, for people reading it. Checked for its form only.
bool is_writer(const Json& value) {
  if (!value.is_string()) return false;
  const std::string& s = value.get_ref<const std::string&>();
  constexpr std::string_view kPrefix = "flowstate ";
  if (!s.starts_with(kPrefix)) return false;
  int parts = 0;
  bool digit = false;
  for (char c : std::string_view(s).substr(kPrefix.size())) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c == '.' && digit && parts < 2) {
      ++parts;
      digit = false;
    } else {
      return false;
    }
  }
  return parts == 2 && digit;
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  auto invalid = [&](const std::string& why) {
    return CheckpointError(path, quote(path) + " is invalid: " + why);
  };
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw CheckpointError(path, quote(path) + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw invalid("it is not a JSON object");
  // The version first: a newer format may differ in everything else.
  auto version = j.find("format_version");
  if (version == j.end() || !version->is_number_unsigned())
    throw invalid("'format_version' is missing or not an unsigned integer");
  const auto v = version->get<std::uint64_t>();
  if (v > kFormatVersion)
    throw CheckpointError(path, quote(path) + " has checkpoint format version " +
                                    std::to_string(v) + ", newer than this build's " +
                                    std::to_string(kFormatVersion) + "; upgrade flowstate");
  if (v == 0) throw invalid("checkpoint format version 0 does not exist");
  // "writer" (the flowstate that wrote it) is informational; manifests before it lack it.
  if (v == 1)
    require_keys(j, {"format", "format_version", "step", "fingerprint", "files"}, "it ", invalid,
                 {"writer"});
  else
    require_keys(j, {"format", "format_version", "step", "world", "files"}, "it ", invalid,
                 {"writer"});
  if (j.contains("writer") && !is_writer(j["writer"]))
    throw invalid("'writer' is not \"flowstate MAJOR.MINOR.PATCH\"");
  if (!j["format"].is_string() || j["format"].get<std::string>() != kFormatName)
    throw invalid("'format' is not \"" + std::string(kFormatName) + "\"");
  Manifest m;
  if (!j["step"].is_number_unsigned()) throw invalid("'step' is not an unsigned integer");
  m.step = j["step"].get<std::uint64_t>();
  if (v == 1) {
    const Json& fp = j["fingerprint"];
    std::optional<std::uint64_t> fingerprint;
    if (fp.is_string()) fingerprint = parse_hex64(fp.get<std::string>());
    if (!fingerprint) throw invalid("'fingerprint' is not 16 lowercase hex digits");
    m.fingerprint = *fingerprint;
  } else {
    if (!j["world"].is_number_unsigned() || j["world"].get<std::uint64_t>() == 0)
      throw invalid("'world' is not a positive integer");
    m.world = j["world"].get<std::uint64_t>();
  }
  const Json& files = j["files"];
  if (!files.is_array() || files.empty()) throw invalid("'files' is not a non-empty array");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const Json& f = files[i];
    const std::string where = "files[" + std::to_string(i) + "] ";
    if (!f.is_object()) throw invalid(where + "is not an object");
    require_keys(f, {"name", "size", "xxh3_64"}, where, invalid);
    ManifestEntry e;
    if (!f["name"].is_string()) throw invalid(where + "has a 'name' that is not a string");
    e.name = f["name"].get<std::string>();
    // A plain file name inside the checkpoint: never a path that leaves it.
    if (e.name.empty() || e.name == "." || e.name == ".." ||
        e.name.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
      throw invalid(where + "has an invalid file name '" + printable(e.name) + "'");
    if (!seen.insert(e.name).second) throw invalid("'" + printable(e.name) + "' is listed twice");
    if (!f["size"].is_number_unsigned())
      throw invalid(where + "has a 'size' that is not an unsigned integer");
    e.size = f["size"].get<std::uint64_t>();
    std::optional<std::uint64_t> sum;
    if (f["xxh3_64"].is_string()) sum = parse_hex64(f["xxh3_64"].get<std::string>());
    if (!sum) throw invalid(where + "has an 'xxh3_64' that is not 16 lowercase hex digits");
    e.checksum = *sum;
    m.files.push_back(std::move(e));
  }
  if (m.world == 0 && !seen.count(std::string(kStateFile)))
    throw invalid("it does not list " + std::string(kStateFile));
  if (m.world != 0) {
    // Exactly one part per rank, in rank order.
    if (m.files.size() != m.world)
      throw invalid("it lists " + std::to_string(m.files.size()) + " files for world " +
                    std::to_string(m.world));
    for (std::uint64_t r = 0; r < m.world; ++r)
      if (m.files[r].name != part_name(r))
        throw invalid("files[" + std::to_string(r) + "] is not " + part_name(r));
  }
  return m;
}

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

struct Candidate {
  StepName name;
  std::string path;
};

/// The step-N and step-N.old directories under `dir`, newest first (step-N before its aside).
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

// ---- writing ----

/// Brings `dir` back to its invariants after a writer died (caller holds the lock): removes
/// `*.tmp` debris, and resolves an interrupted replacement — the new step-N is kept when it
/// verifies, else the old one comes back from step-N.old.
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

/// Keeps `keep` verified checkpoints counting the one just committed at `step`; removes the
/// older ones beyond them. Checkpoints with a higher step (from a run that was resumed from
/// an earlier point) are neither counted nor removed: re-checkpointing replaces them.
void prune(const std::string& dir, std::uint64_t step, std::size_t keep) {
  std::size_t kept = 1;
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
  }
  // No fsync: a pruned checkpoint that comes back after a power loss is an older valid one,
  // which the newest-valid rule passes over and the next prune removes.
}

/// What is wrong with LATEST, if anything ("path: reason"): unreadable, garbage, or naming a
/// step directory that is not there (unless a replacement of it was interrupted).
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

/// Throws when a checkpoint that verifies has a higher step than `step` (caller holds the
/// lock): writing below it would leave a resume on the other run's checkpoint.
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
  void commit(const Manifest& manifest) {
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

  /// Leaves the directory as it was before the write: the old step-N back in place, no
  /// debris. Never throws: what it cannot undo, the next writer's clean_up finishes.
  void roll_back() noexcept {
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

  /// After a commit: LATEST (a hint only — the newest valid step wins — so no fsync, and a
  /// failure to write it does not fail the committed checkpoint), the aside copy dropped
  /// (debris if it comes back after a power loss), and the oldest steps beyond `keep`.
  void finish(std::uint64_t step, std::size_t keep) {
    phase_("renamed");
    try {
      replace_file_atomically(join(dir_, kLatestFile), name_ + "\n", Durability::kHint);
    } catch (const CheckpointError&) {
    }
    phase_("latest-written");
    if (moved_aside_) remove_tree(aside_);
    if (keep > 0) prune(dir_, step, keep);
  }

 private:
  std::string dir_, name_, final_dir_, tmp_, aside_;
  Phase phase_;
  bool moved_aside_ = false;
  bool renamed_ = false;
};

}  // namespace

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
    write_file_durably(join(tmp, kStateFile), state);  // fsync 1
    phase("state-written");
    // fsync 2 (the manifest) and 3 (the parent: the commit).
    commit.commit(Manifest{
        step, decoded.fingerprint, 0, {{std::string(kStateFile), state.size(), hash64(state)}}});
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
  remove_tree(join(dir, kLatestFile));
  remove_tree(join(dir, std::string(kLatestFile) + std::string(kTmpSuffix)));
  fsync_directory(dir);
}

}  // namespace flowstate

// ---- many ranks ----

namespace flowstate {

void agree(Coordinator& coordinator, const std::optional<std::string>& error,
           const std::string& where) {
  // "1<message>" from a rank that failed, "0" from one that did not.
  const std::vector<std::string> all = coordinator.all_gather(error ? "1" + *error : "0");
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty() && all[r][0] == '1')
      throw CheckpointError(where, "rank " + std::to_string(r) + ": " + all[r].substr(1));
}

namespace {

/// Runs `fn` and returns its error's message instead of throwing it.
template <class Fn>
std::optional<std::string> outcome(Fn&& fn) {
  try {
    fn();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

}  // namespace

std::string write_group_checkpoint(const std::string& dir, std::uint64_t step,
                                   std::string_view state, Coordinator& coordinator,
                                   const CheckpointWriteOptions& options) {
  const std::uint64_t rank = coordinator.rank(), world = coordinator.world();
  auto phase = [&](std::string_view name) {
    if (options.hook) options.hook(name);
  };
  StepCommit commit(dir, step, phase);
  const std::string& final_dir = commit.final_dir();
  const std::string& tmp = commit.tmp();
  const std::string part = join(tmp, part_name(rank));

  // 1. Rank 0 prepares step-N.tmp under the writers' lock, which it holds until the commit;
  // every rank checks that its state can be restored, and that all write the same step.
  std::optional<DirectoryLock> lock;
  bool created = false;
  const std::optional<std::string> prepared = outcome([&] {
    PipelineState::decode(state, "state");
    if (rank != 0) return;
    create_directories_durably(dir);
    lock.emplace(join(dir, kLockFile));
    clean_up(dir);
    if (!options.overwrite) refuse_if_behind(dir, step);
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw CheckpointError(tmp,
                            "cannot create directory " + quote(tmp) + ": " + std::strerror(errno));
    created = true;
    phase("tmp-created");
  });
  const std::vector<std::string> ready =
      coordinator.all_gather(prepared ? "1" + *prepared : "0" + std::to_string(step));
  std::optional<std::string> refused;
  std::string steps;
  for (std::size_t r = 0; r < ready.size(); ++r) {
    if (!refused && ready[r][0] == '1')
      refused = "rank " + std::to_string(r) + ": " + ready[r].substr(1);
    steps += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " at step " +
             ready[r].substr(1);
  }
  if (!refused)
    for (const auto& m : ready)
      if (m != ready[0])
        refused = "the ranks checkpoint different steps (" + steps +
                  "): every rank must take the same number of steps (shard's uneven: pad or drop)";
  if (refused) {
    if (created) remove_tree(tmp);
    throw CheckpointError(final_dir, "checkpoint " + quote(final_dir) + " failed: " + *refused);
  }

  // 2. Every rank writes and fsyncs its part, and tells rank 0 its size and checksum.
  std::optional<std::string> error = outcome([&] {
    std::error_code ec;
    if (!fs::is_directory(tmp, ec))
      throw CheckpointError(tmp, "rank " + std::to_string(rank) + " cannot see " + quote(tmp) +
                                     ", which rank 0 created: the checkpoint directory must be "
                                     "one directory shared by every rank (not node-local)");
    write_file_durably(part, state);
    phase("part-written");
  });
  const std::vector<std::string> parts = coordinator.all_gather(
      error ? "1" + *error : "0" + std::to_string(state.size()) + " " + hex64(hash64(state)));

  // 3. Rank 0 commits: every part visible with its size, the manifest, the rename.
  error.reset();
  for (std::size_t r = 0; r < parts.size() && !error; ++r)
    if (!parts[r].empty() && parts[r][0] == '1')
      error = "rank " + std::to_string(r) + ": " + parts[r].substr(1);
  if (rank == 0) {
    if (!error) {
      error = outcome([&] {
        Manifest manifest{step, 0, world, {}};
        for (std::uint64_t r = 0; r < world; ++r) {
          ManifestEntry e{part_name(r), 0, 0};
          const std::string& msg = parts[r];
          const auto space = msg.find(' ');
          e.size = std::stoull(msg.substr(1, space - 1));
          e.checksum = *parse_hex64(msg.substr(space + 1));
          const std::string path = join(tmp, e.name);
          struct stat st {};
          if (::stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != e.size)
            throw CheckpointError(path, "rank " + std::to_string(r) + "'s part " + quote(path) +
                                            " is not visible from rank 0 as it was written: the "
                                            "checkpoint directory must be one directory shared "
                                            "by every rank (not node-local)");
          manifest.files.push_back(std::move(e));
        }
        commit.commit(manifest);  // the commit, for every rank at once
      });
    }
    if (error)
      commit.roll_back();
    else
      commit.finish(step, options.keep);
  }
  // 4. Rank 0 says whether it committed; every rank returns or throws the same.
  const std::vector<std::string> committed =
      coordinator.all_gather(rank == 0 ? (error ? "1" + *error : "0") : "");
  if (committed[0].size() > 0 && committed[0][0] == '1')
    throw CheckpointError(final_dir,
                          "checkpoint " + quote(final_dir) + " failed: " + committed[0].substr(1));
  return final_dir;
}

std::optional<CheckpointFound> find_group_checkpoint(const std::string& dir,
                                                     Coordinator& coordinator) {
  const std::uint64_t rank = coordinator.rank();
  // Each rank: the steps whose part it verifies, newest first, and whether it sees evidence.
  std::vector<CheckpointFound> verified;
  std::vector<std::string> reasons;
  bool evidence = false;
  std::optional<std::string> error = outcome([&] {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    if (auto problem = latest_problem(dir)) reasons.push_back(*problem);
    for (const auto& c : list_candidates(dir)) {
      if (!verified.empty() && verified.back().step == c.name.step) continue;  // its .old
      try {
        verified.push_back(read_checkpoint(c.path, rank));
      } catch (const CheckpointError& e) {
        reasons.push_back(c.path + ": " + e.what());
      }
    }
    evidence = !verified.empty() || !find_checkpoint_evidence(dir).empty();
  });
  std::string mine = error ? "1" + *error : std::string(evidence ? "0e" : "0n");
  for (const auto& f : verified) mine += " " + std::to_string(f.step);
  const std::vector<std::string> all = coordinator.all_gather(mine);

  std::optional<std::set<std::uint64_t>> common;
  bool any_evidence = false;
  std::string summary;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || all[r][0] == '1')
      throw CheckpointError(dir, "rank " + std::to_string(r) + ": " + all[r].substr(1));
    any_evidence |= all[r][1] == 'e';
    std::set<std::uint64_t> steps;
    std::string list;
    for (std::size_t at = 2; at < all[r].size();) {
      const std::size_t next = std::min(all[r].find(' ', at + 1), all[r].size());
      const std::uint64_t s = std::stoull(all[r].substr(at + 1, next - at - 1));
      steps.insert(s);
      list += (list.empty() ? "" : ", ") + std::to_string(s);
      at = next;
    }
    summary += "\n  rank " + std::to_string(r) + " verifies " +
               (list.empty() ? std::string("no step") : "steps " + list);
    if (!common) {
      common = std::move(steps);
    } else {
      std::set<std::uint64_t> both;
      std::set_intersection(common->begin(), common->end(), steps.begin(), steps.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (!common || common->empty()) {
    if (!any_evidence) return std::nullopt;
    throw CheckpointError(dir, "no checkpoint under '" + dir +
                                   "' verifies on every rank (the directory must be one "
                                   "directory shared by every rank):" +
                                   summary);
  }
  const std::uint64_t step = *common->rbegin();
  for (auto& f : verified) {
    if (f.step != step) {
      if (f.step > step)
        reasons.push_back(f.path + ": not every rank verifies its part of step " +
                          std::to_string(f.step));
      continue;
    }
    f.skipped = std::move(reasons);
    return std::move(f);
  }
  throw CheckpointError(dir, "internal: step " + std::to_string(step) + " vanished");
}

}  // namespace flowstate
