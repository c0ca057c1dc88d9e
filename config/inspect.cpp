#include "flowstate/config/inspect.h"

#include <filesystem>
#include <sstream>

#include <cereal/types/string.hpp>
#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/state.h"

namespace flowstate {
namespace {

std::string lookup(const std::vector<CanonicalParam>& canonical, const std::string& key) {
  for (const auto& [k, v] : canonical)
    if (k == key) return v;
  return "";
}

/// A mix input's canonical pairs, from its description "{k=v; k=v; ...}".
std::vector<CanonicalParam> input_canonical(const std::string& text) {
  std::vector<CanonicalParam> out;
  if (text.size() < 2) return out;
  const std::string body = text.substr(1, text.size() - 2);
  std::size_t at = 0;
  while (at < body.size()) {
    std::size_t next = body.find("; ", at);
    if (next == std::string::npos) next = body.size();
    const std::string item = body.substr(at, next - at);
    const std::size_t eq = item.find('=');
    if (eq != std::string::npos) out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    at = next + 2;
  }
  return out;
}

class Describer {
 public:
  explicit Describer(const Registry& registry) : registry_(registry) {}

  std::string nodes(std::string_view spine, const std::vector<CanonicalParam>& canonical) {
    StateReadLimit limit(spine.size());
    if (auto entries = parse_stamp(spine)) return list(*entries, canonical);
    return legacy(spine, canonical);
  }

 private:
  std::string list(const std::vector<StampEntry>& entries,
                   const std::vector<CanonicalParam>& canonical) {
    std::string out = "[";
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (i != 0) out += ',';
      out += entry(entries[i], lookup(canonical, entries[i].name), canonical);
    }
    return out + "]";
  }

  const NodeDef* def_of(const std::string& type) const {
    const NodeSchema* s = registry_.find(type);
    return s != nullptr && s->def != nullptr && s->def->inspect ? s->def : nullptr;
  }

  InspectContext context(const std::string& name, const std::vector<CanonicalParam>& canonical) {
    InspectContext ctx;
    ctx.param = [name, &canonical](const std::string& key) {
      return lookup(canonical, name + "." + key);
    };
    ctx.pipeline_param = [&canonical](const std::string& key) { return lookup(canonical, key); };
    ctx.nested = [this](const std::vector<StampEntry>& entries, const std::string& text) {
      return list(entries, input_canonical(text));
    };
    return ctx;
  }

  std::string entry(const StampEntry& e, const std::string& type,
                    const std::vector<CanonicalParam>& canonical) {
    JsonObject j;
    j.add("name", e.name).add("type", type);
    const NodeDef* def = def_of(type);
    if (def == nullptr) {
      return j.add("state_bytes", std::uint64_t{e.bytes.size()}).add("unknown_type", true).str();
    }
    std::istringstream is{e.bytes, std::ios::binary};
    InArchive ar(is);
    StateReadLimit limit(e.bytes.size());
    InspectContext ctx = context(e.name, canonical);
    ctx.whole_entry = true;
    return j.add_raw("state", def->inspect(ar, ctx)).str();
  }

  std::string legacy(std::string_view spine, const std::vector<CanonicalParam>& canonical) {
    std::istringstream is{std::string(spine), std::ios::binary};
    InArchive ar(is);
    std::uint32_t count = 0;
    ar(count);
    std::string out = "[";
    for (std::uint32_t i = 0; i < count; ++i) {
      std::string name;
      load_bounded(ar, name);
      const std::string type = lookup(canonical, name);
      JsonObject j;
      j.add("name", name).add("type", type);
      const NodeDef* def = def_of(type);
      out += i ? "," : "";
      if (def == nullptr || type == "mix") {
        // Without its definition the rest cannot be split into nodes; a first-format mix
        // state nests its inputs without entries.
        const auto pos = static_cast<std::size_t>(is.tellg());
        return out +
               j.add("undecoded_bytes", std::uint64_t{spine.size() - std::min(pos, spine.size())})
                   .str() +
               "]";
      }
      out += j.add_raw("state", def->inspect(ar, context(name, canonical))).str();
    }
    return out + "]";
  }

  const Registry& registry_;
};

}  // namespace

std::string describe_node_states(std::string_view spine,
                                 const std::vector<CanonicalParam>& canonical,
                                 const std::string& origin, const Registry& registry) {
  try {
    return Describer(registry).nodes(spine, canonical);
  } catch (const std::exception& e) {
    throw CheckpointError(
        origin, "the node states in '" + origin + "' are truncated or corrupt: " + e.what());
  }
}

namespace {

using Json = nlohmann::ordered_json;

const char* source_name(StateSource::Kind kind) {
  switch (kind) {
    case StateSource::Kind::kCheckpoint:
      return "checkpoint";
    case StateSource::Kind::kFile:
      return "file";
    case StateSource::Kind::kBytes:
      break;
  }
  return "bytes";
}

std::string render_value(const Json& v) {
  if (v.is_null()) return "none";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    std::string s;
    for (const auto& [k, x] : v.items()) s += (s.empty() ? "" : ", ") + k + " " + render_value(x);
    return "(" + s + ")";
  }
  return v.dump();
}

}  // namespace

std::string describe_state(std::string_view state, const StateSource& source,
                           const Registry& registry) {
  // Messages name the file the bytes came from.
  const std::string origin =
      source.kind == StateSource::Kind::kCheckpoint
          ? (std::filesystem::path(source.path) / "state.bin").string()
          : (source.kind == StateSource::Kind::kFile ? source.path : std::string("state"));
  const PipelineState s = PipelineState::decode(state, origin);
  const Json nodes = Json::parse(describe_node_states(s.spine, s.canonical, origin, registry));

  Json j;
  j["source"] = source_name(source.kind);
  j["path"] = source.path.empty() ? Json(nullptr) : Json(source.path);
  j["bytes"] = state.size();
  j["step"] = source.step.value_or(s.last_step ? *s.last_step + 1 : 0);
  j["format_version"] = s.format_version;
  j["fingerprint"] = hex64(s.fingerprint);
  j["last_step"] = s.last_step ? Json(*s.last_step) : Json(nullptr);
  j["last_epoch"] = s.last_epoch ? Json(*s.last_epoch) : Json(nullptr);
  j["skipped_checkpoints"] = source.skipped;
  Json canonical = Json::array();
  for (const auto& [k, v] : s.canonical) canonical.push_back({{"key", k}, {"value", v}});
  j["pipeline"] = canonical;
  Json skips = Json::array();
  for (const auto& [a, b] : s.skips) skips.push_back({a, b});
  j["skipped_steps"] = skips;
  Json changes = Json::array();
  for (const auto& c : s.data_changes) changes.push_back({{"step", c.step}, {"what", c.what}});
  j["data_changes"] = changes;
  j["nodes"] = nodes;
  if (!source.fields_json.empty()) j["state_dict"] = Json::parse(source.fields_json);
  // A path or value that is not UTF-8 (a file name in another encoding): each byte outside
  // well-formed UTF-8 becomes U+FFFD, as the node states' JSON does (nodes/definition.cpp).
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

std::string render_state_description(std::string_view description) {
  const Json j = Json::parse(description);
  const std::string source = j["source"].get<std::string>();
  const auto step = std::to_string(j["step"].get<std::uint64_t>());
  std::string out = source == "checkpoint" ? "checkpoint: " + j["path"].get<std::string>() + "\n"
                    : source == "file"     ? "state file: " + j["path"].get<std::string>() + "\n"
                                           : "state: " + j["bytes"].dump() + " bytes\n";
  out += "step: " + step + " (batches consumed; the next batch is step " + step + ")\n";
  out += "last delivered: " +
         (j["last_step"].is_null()
              ? std::string("none")
              : "step " + j["last_step"].dump() + ", epoch " +
                    (j["last_epoch"].is_null() ? std::string("0") : j["last_epoch"].dump())) +
         "\n";
  out += "format version: " + j["format_version"].dump() + "\n";
  out += "fingerprint: " + j["fingerprint"].get<std::string>() + "\n";
  for (const auto& k : j["skipped_checkpoints"])
    out += "skipped newer checkpoint: " + k.get<std::string>() + "\n";
  if (j.contains("state_dict")) {
    std::string fields;
    for (const auto& [k, v] : j["state_dict"].items())
      fields += (fields.empty() ? "" : ", ") + k + " " + render_value(v);
    out += "state_dict: " + (fields.empty() ? std::string("no other fields") : fields) + "\n";
  }
  out += "pipeline:\n";
  for (const auto& p : j["pipeline"])
    out += "  " + p["key"].get<std::string>() + " = " + p["value"].get<std::string>() + "\n";
  out += "skipped steps:";
  const Json& skips = j["skipped_steps"];
  if (skips.empty()) out += " none";
  for (std::size_t i = 0; i < skips.size(); ++i)
    out += (i ? ", " : " ") + skips[i][0].dump() + ".." + skips[i][1].dump();
  out += "\ndata changes:";
  if (!j.contains("data_changes") || j["data_changes"].empty()) out += " none";
  if (j.contains("data_changes"))
    for (const auto& c : j["data_changes"]) {
      std::string what = c["what"].get<std::string>();
      for (std::size_t at = what.find('\n'); at != std::string::npos; at = what.find('\n', at + 1))
        what.replace(at, 1, "\n      ");
      out += "\n  step " + c["step"].dump() + ": " + what;
    }
  out += "\nnode states:\n";
  for (const auto& n : j["nodes"]) {
    out += "  " + n["name"].get<std::string>() + " (" + n["type"].get<std::string>() + "): ";
    if (n.contains("state")) {
      std::string fields;
      for (const auto& [k, v] : n["state"].items()) {
        // A file source's data identity: the count here, every file with --json.
        const std::string value = k == "files" && v.is_array()
                                      ? std::to_string(v.size()) + " (--json lists them)"
                                      : render_value(v);
        fields += (fields.empty() ? "" : ", ") + k + " " + value;
      }
      out += fields + "\n";
    } else if (n.contains("unknown_type")) {
      out += "not decoded: no node type '" + n["type"].get<std::string>() +
             "' is registered (load its plugin with --plugin); " +
             std::to_string(n["state_bytes"].get<std::size_t>()) + " bytes\n";
    } else {
      out += "not decoded (" + std::to_string(n["undecoded_bytes"].get<std::size_t>()) +
             " bytes of node states from here on)\n";
    }
  }
  return out;
}

}  // namespace flowstate
