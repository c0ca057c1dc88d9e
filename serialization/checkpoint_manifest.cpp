// The checkpoint format: the names of a checkpoint's entries (step-N, rank-K.bin) and its
// MANIFEST.json (format version 1: one process's state.bin; version 2: the parts of many
// ranks), encoded and parsed. The directory protocol is in checkpoint_directory.cpp.
#include "flowstate/serialization/checkpoint_internal.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/version.h"

namespace flowstate::checkpoint_detail {

namespace fs = std::filesystem;

std::string join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

std::string quote(const std::string& path) { return "'" + path + "'"; }

std::string step_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012llu", static_cast<unsigned long long>(step));
  return buf;
}

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

std::string part_name(std::uint64_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05llu.bin", static_cast<unsigned long long>(rank));
  return buf;
}

namespace {

using Json = nlohmann::ordered_json;

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

}  // namespace

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

}  // namespace flowstate::checkpoint_detail
