#include "cli/spine_state.h"

#include <sstream>

#include <cereal/types/string.hpp>

#include "core/error.h"
#include "nodes/batch.h"
#include "nodes/filter.h"
#include "nodes/mix.h"
#include "nodes/pack.h"
#include "nodes/shuffle.h"
#include "nodes/sources/records.h"

namespace flowstate::cli {
namespace {

std::string lookup(const std::vector<CanonicalParam>& canonical, const std::string& key) {
  for (const auto& [k, v] : canonical)
    if (k == key) return v;
  return "";
}

nlohmann::ordered_json cursor(InArchive& ar) {
  CursorState s;
  ar(s);
  return {{"epoch", s.epoch}, {"cursor", s.cursor}};
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

/// Decodes the state of node `name` of `type`; false (nothing read) for a type it does not
/// know.
bool decode_node(InArchive& ar, const std::string& name, const std::string& type,
                 const std::vector<CanonicalParam>& canonical, nlohmann::ordered_json& node) {
  if (type == "records" || type == "lines" || type == "tar" || type == "shard" ||
      (type == "shuffle" && lookup(canonical, name + ".mode") == "global")) {
    node["state"] = cursor(ar);
  } else if (type == "shuffle") {
    BufferShuffleState s;
    ar(s);
    nlohmann::ordered_json st{{"epoch", s.epoch}, {"draws", s.draws}};
    if (s.keyframe) {
      st["keyframe"] = {{"draws", s.keyframe->draws}, {"slots", s.keyframe->slots.size()}};
    } else {
      st["keyframe"] = nullptr;
    }
    node["state"] = st;
  } else if (type == "filter") {
    FilterState s;
    ar(s);
    node["state"] = {{"epoch", s.epoch}, {"dropped", s.dropped}};
  } else if (type == "pack") {
    PackState s;
    ar(s);
    nlohmann::ordered_json st{{"epoch", s.epoch}, {"rows", s.rows}, {"documents", s.documents}};
    st["carry"] = s.has_carry ? nlohmann::ordered_json{{"record", s.carry.to_string()},
                                                       {"tokens_used", s.carry_at}}
                              : nlohmann::ordered_json(nullptr);
    node["state"] = st;
  } else if (type == "batch") {
    BatchState s;
    ar(s);
    node["state"] = {{"epoch", s.epoch},
                     {"next_step", s.step},
                     {"next_index_in_epoch", s.index_in_epoch},
                     {"epoch_started", s.started}};
  } else if (type == "mix") {
    std::vector<std::vector<CanonicalParam>> inputs;
    for (std::size_t k = 0;; ++k) {
      const std::string text = lookup(canonical, name + ".inputs[" + std::to_string(k) + "]");
      if (text.empty()) break;
      inputs.push_back(input_canonical(text));
    }
    MixState s;
    s.expected_inputs = static_cast<std::uint32_t>(inputs.size());
    ar(s);
    nlohmann::ordered_json st{{"epoch", s.epoch}, {"draws", s.draws}, {"ended", s.ended}};
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      nlohmann::ordered_json in{
          {"epoch", s.input_epoch[k]}, {"taken", s.taken[k]}, {"exhausted", s.exhausted[k] != 0}};
      nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
      // The input's stateful nodes, in order: every node but its maps.
      for (const auto& [key, value] : inputs[k]) {
        if (key.find('.') != std::string::npos || key == "seed" || value == "map") continue;
        std::string saved;
        ar(saved);
        if (saved != key)
          throw CheckpointError("state", "mix input " + std::to_string(k) + " holds node '" +
                                             saved + "' where its pipeline has '" + key + "'");
        nlohmann::ordered_json n{{"name", key}, {"type", value}};
        if (!decode_node(ar, key, value, inputs[k], n)) return false;
        nodes.push_back(n);
      }
      in["nodes"] = nodes;
      list.push_back(in);
    }
    st["inputs"] = list;
    node["state"] = st;
  } else {
    return false;
  }
  return true;
}

}  // namespace

nlohmann::ordered_json describe_spine_state(std::string_view spine,
                                            const std::vector<CanonicalParam>& canonical,
                                            const std::string& origin) {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  std::istringstream is{std::string(spine), std::ios::binary};
  try {
    InArchive ar(is);
    std::uint32_t count = 0;
    ar(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      std::string name;
      ar(name);
      const std::string type = lookup(canonical, name);
      nlohmann::ordered_json node{{"name", name}, {"type", type}};
      if (!decode_node(ar, name, type, canonical, node)) {
        // Unknown layout: the rest cannot be split into nodes.
        const auto pos = static_cast<std::size_t>(is.tellg());
        node.erase("state");
        node["undecoded_bytes"] = spine.size() - std::min(pos, spine.size());
        nodes.push_back(node);
        return nodes;
      }
      nodes.push_back(node);
    }
  } catch (const std::exception& e) {
    throw CheckpointError(
        origin, "the node states in '" + origin + "' are truncated or corrupt: " + e.what());
  }
  return nodes;
}

}  // namespace flowstate::cli
