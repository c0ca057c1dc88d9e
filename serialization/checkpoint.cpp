// The on-disk checkpoint protocol — write, verify, find the newest valid step, prune, remove —
// kept in one file (over 600 lines) so that its crash guarantees can be read in one place.
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
#include <set>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
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

constexpr std::uint64_t kFormatVersion = 1;
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
  std::uint64_t fingerprint = 0;
  std::vector<ManifestEntry> files;
};

std::string encode_manifest(const Manifest& m) {
  Json files = Json::array();
  for (const auto& f : m.files)
    files.push_back(Json{{"name", f.name}, {"size", f.size}, {"xxh3_64", hex64(f.checksum)}});
  Json j;
  j["format"] = kFormatName;
  j["format_version"] = kFormatVersion;
  j["step"] = m.step;
  j["fingerprint"] = hex64(m.fingerprint);
  j["files"] = std::move(files);
  return j.dump(2) + "\n";
}

/// Checks that `object` has exactly `keys`: a key damaged by a flipped byte is an error, not
/// an ignored extra.
void require_keys(const Json& object, std::initializer_list<std::string_view> keys,
                  const std::string& where, const auto& invalid) {
  for (auto k : keys)
    if (!object.contains(std::string(k))) throw invalid(where + "has no '" + std::string(k) + "'");
  for (const auto& item : object.items())
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end())
      throw invalid(where + "has an unknown key '" + printable(item.key()) + "'");
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
  require_keys(j, {"format", "format_version", "step", "fingerprint", "files"}, "it ", invalid);
  if (!j["format"].is_string() || j["format"].get<std::string>() != kFormatName)
    throw invalid("'format' is not \"" + std::string(kFormatName) + "\"");
  Manifest m;
  if (!j["step"].is_number_unsigned()) throw invalid("'step' is not an unsigned integer");
  m.step = j["step"].get<std::uint64_t>();
  const Json& fp = j["fingerprint"];
  std::optional<std::uint64_t> fingerprint;
  if (fp.is_string()) fingerprint = parse_hex64(fp.get<std::string>());
  if (!fingerprint) throw invalid("'fingerprint' is not 16 lowercase hex digits");
  m.fingerprint = *fingerprint;
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
  if (!seen.count(std::string(kStateFile)))
    throw invalid("it does not list " + std::string(kStateFile));
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

  const std::string name = step_name(step);
  const std::string final_dir = join(dir, name);
  const std::string tmp = final_dir + std::string(kTmpSuffix);
  const std::string aside = final_dir + std::string(kAsideSuffix);
  bool moved_aside = false;
  bool renamed = false;
  try {
    // No fsync of `dir` for the new entry: until the rename below, it is debris anyway.
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw CheckpointError(tmp,
                            "cannot create directory " + quote(tmp) + ": " + std::strerror(errno));
    phase("tmp-created");
    write_file_durably(join(tmp, kStateFile), state);  // fsync 1
    phase("state-written");
    Manifest manifest{
        step, decoded.fingerprint, {{std::string(kStateFile), state.size(), hash64(state)}}};
    write_file_durably(join(tmp, kManifestFile), encode_manifest(manifest));  // fsync 2
    phase("manifest-written");
    if (exists(final_dir)) {
      // Re-checkpointing a step (after a resume): the old copy stays valid, under a name
      // readers fall back to, until the new one is in place. Both renames share the fsync
      // below; a journaling file system makes them durable in order.
      rename_path(final_dir, aside);
      moved_aside = true;
      phase("moved-aside");
    }
    rename_path(tmp, final_dir);
    renamed = true;
    fsync_directory(dir);  // fsync 3: the commit
  } catch (...) {
    // Leave the directory as it was: the old step-N back in place, no debris.
    try {
      if (renamed) {
        // Only the fsync failed: the checkpoint is in place but maybe not on disk. Take it
        // back out, so that what readers see agrees with the error.
        rename_path(final_dir, tmp);
      }
      if (moved_aside) rename_path(aside, final_dir);
      remove_tree(tmp);
      fsync_directory(dir);
    } catch (const CheckpointError&) {
      // The next writer's clean_up finishes the job.
    }
    throw;
  }
  phase("renamed");
  // A hint only (the newest valid step wins): no fsync, and a failure to write it does not
  // fail a checkpoint that is committed.
  try {
    replace_file_atomically(join(dir, kLatestFile), name + "\n", Durability::kHint);
  } catch (const CheckpointError&) {
  }
  phase("latest-written");
  if (moved_aside) remove_tree(aside);  // debris if it comes back after a power loss
  if (options.keep > 0) prune(dir, step, options.keep);
  return final_dir;
}

CheckpointFound read_checkpoint(const std::string& checkpoint_dir) {
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
  for (const auto& f : m.files) {
    const std::string path = join(dir, f.name);
    std::string bytes = d.read(f.name, f.size, 0, "");
    const std::uint64_t sum = hash64(bytes);
    if (sum != f.checksum)
      throw CheckpointError(path, quote(path) + " is corrupt: its XXH3-64 checksum is " +
                                      hex64(sum) + ", the manifest lists " + hex64(f.checksum));
    if (f.name == kStateFile) found.state = std::move(bytes);
  }
  // The bytes are what was written; decoding also catches a state this build cannot read.
  const std::string state_path = join(dir, kStateFile);
  const PipelineState s = PipelineState::decode(found.state, state_path);
  if (s.fingerprint != m.fingerprint)
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
