#include "flowstate/serialization/pipeline_state.h"

#include <algorithm>
#include <map>
#include <sstream>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/state.h"

namespace flowstate {
namespace {
constexpr std::string_view kMagic = "FLWSTATE";
}

std::string PipelineState::encode() const {
  std::ostringstream os(std::ios::binary);
  os.write(kMagic.data(), static_cast<std::streamsize>(kMagic.size()));
  {
    cereal::PortableBinaryOutputArchive ar(os);
    const std::uint32_t version = std::max(format_version, data_changes.empty() ? 1U : 2U);
    ar(version, fingerprint, canonical, last_step, last_epoch, skips, spine);
    if (version >= 2) {
      ar(static_cast<std::uint64_t>(data_changes.size()));
      for (const auto& c : data_changes) ar(c.step, c.what);
    }
  }
  return std::move(os).str();
}

PipelineState PipelineState::decode(std::string_view bytes, const std::string& origin) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic)
    throw CheckpointError(origin, "'" + origin + "' is not a flowstate state (bad magic)");
  std::istringstream is(std::string(bytes.substr(kMagic.size())), std::ios::binary);
  PipelineState s;
  try {
    cereal::PortableBinaryInputArchive ar(is);
    ar(s.format_version);
    if (s.format_version > kFormatVersion)
      throw CheckpointError(origin, "'" + origin + "' has state format version " +
                                        std::to_string(s.format_version) +
                                        ", newer than this build's " +
                                        std::to_string(kFormatVersion) + "; upgrade flowstate");
    StateReadLimit limit(bytes.size());
    ar(s.fingerprint);
    s.canonical.resize(static_cast<std::size_t>(load_bounded_size(ar)));
    for (auto& [k, v] : s.canonical) {
      load_bounded(ar, k);
      load_bounded(ar, v);
    }
    ar(s.last_step, s.last_epoch);
    s.skips.resize(static_cast<std::size_t>(load_bounded_size(ar)));
    for (auto& r : s.skips) ar(r);
    load_bounded(ar, s.spine);
    if (s.format_version >= 2) {
      s.data_changes.resize(static_cast<std::size_t>(load_bounded_size(ar)));
      for (auto& c : s.data_changes) {
        ar(c.step);
        load_bounded(ar, c.what);
      }
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(origin, "'" + origin + "' is truncated or corrupt: " + e.what());
  }
  if (fingerprint_of(s.canonical) != s.fingerprint)
    throw CheckpointError(origin, "'" + origin +
                                      "' is corrupt: its fingerprint does not match "
                                      "its pipeline description");
  return s;
}

std::uint64_t fingerprint_of(const std::vector<CanonicalParam>& canonical) {
  Hasher h(0x666c6f77);
  for (const auto& [k, v] : canonical) {
    h.update(k).update("\0", 1).update(v).update("\0", 1);
  }
  return h.digest();
}

namespace {

/// Why a per-rank shard cannot change its world, and what can.
std::string world_hint(const std::map<std::string, std::string>& params, const std::string& key) {
  if (!key.ends_with(".world")) return "";
  auto node = params.find(key.substr(0, key.size() - 6));
  if (node == params.end() || node->second != "shard") return "";
  return " (a shard before batch gives each rank its own records, so its checkpoints resume "
         "only on the same world; for an elastic job place shard after batch, which cuts "
         "each global batch into world slices and resumes on any world that divides it)";
}

}  // namespace

std::string describe_mismatch(const std::vector<CanonicalParam>& in_checkpoint,
                              const std::vector<CanonicalParam>& now) {
  std::map<std::string, std::string> a(in_checkpoint.begin(), in_checkpoint.end());
  std::map<std::string, std::string> b(now.begin(), now.end());
  std::string out;
  auto line = [&](const std::string& s) { out += (out.empty() ? "" : "\n") + s; };
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end())
      line(k + ": " + v + " in checkpoint, absent now");
    else if (it->second != v)
      line(k + ": " + v + " in checkpoint, " + it->second + " now" + world_hint(a, k));
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) line(k + ": absent in checkpoint, " + v + " now");
  if (out.empty()) {
    // Same parameters in another order: the node order changed.
    std::vector<std::string> ka, kb;
    for (const auto& p : in_checkpoint) ka.push_back(p.first);
    for (const auto& p : now) kb.push_back(p.first);
    if (ka != kb) line("node order differs from the checkpoint's");
  }
  return out;
}

}  // namespace flowstate
