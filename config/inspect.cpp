#include "flowstate/config/inspect.h"

#include <sstream>

#include <cereal/types/string.hpp>

#include "flowstate/core/error.h"
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
    for (std::size_t i = 0; i < entries.size(); ++i)
      out += (i ? "," : "") + entry(entries[i], lookup(canonical, entries[i].name), canonical);
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

}  // namespace flowstate
