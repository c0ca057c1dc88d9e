#include "cli/spine_state.h"

#include <sstream>

#include <cereal/types/string.hpp>

#include "core/error.h"
#include "nodes/batch.h"
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
      if (type == "records" || type == "shard" ||
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
      } else if (type == "batch") {
        BatchState s;
        ar(s);
        node["state"] = {{"epoch", s.epoch},
                         {"next_step", s.step},
                         {"next_index_in_epoch", s.index_in_epoch},
                         {"epoch_started", s.started}};
      } else {
        // Unknown layout: the rest cannot be split into nodes.
        const auto pos = static_cast<std::size_t>(is.tellg());
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
