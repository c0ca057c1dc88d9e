#include "flowstate/nodes/map.h"

namespace flowstate {

void MapOptions::validate() const {
  if (!fn && !batch_fn) throw ConfigError("", "map needs a function");
}

NodeDescription MapOptions::describe() const {
  NodeDescription d{"map", {{"fn", name}}};
  for (const auto& p : params) d.params.push_back(p);
  if (workers) d.params.push_back({"workers", std::to_string(*workers), true});
  return d;
}

const NodeDef& map_node() {
  static const NodeDef def = define_node<MapOptions>(
      {.type = "map",
       .phase = Phase::kPerSample,
       .doc = "applies a function to every sample (before batch) or batch (after it)"},
      [](BuildContext& ctx, const MapOptions& o) { ctx.add_sample_map(o.fn); });
  return def;
}

const NodeDef& batch_map_node() {
  static const NodeDef def = define_node<MapOptions>(
      {.type = "map", .phase = Phase::kPerBatch, .doc = map_node().doc},
      [](BuildContext& ctx, const MapOptions& o) { ctx.add_batch_map(o.batch_fn); });
  return def;
}

}  // namespace flowstate
