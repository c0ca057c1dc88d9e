#include "flowstate/nodes/map.h"

#include "flowstate/core/error.h"
#include "flowstate/nodes/transform.h"

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

namespace {

/// `- map: {fn: NAME, ...}`: `fn` names a transform of the caller's registry, whose parameters
/// go beside it; after batch the transform's per-batch function runs.
std::shared_ptr<const YamlForm> map_yaml(const NodeDef& def) {
  auto f = std::make_shared<YamlForm>();
  f->doc = "applies a named transform to every sample (before batch) or batch (after it)";
  f->params = def.params;  // fn and workers; in YAML fn names a transform
  f->params[0].required = true;
  f->params[0].default_value.reset();
  f->params[0].doc = "the transform (see the transforms below); its parameters go beside fn";
  f->dispatch = "fn";
  f->extra_params = [](const YamlContext& ctx,
                       const std::string& fn) -> const std::vector<ParamSchema>* {
    const TransformSchema* t = ctx.transform(fn);
    return t != nullptr ? &t->params : nullptr;
  };
  f->dispatch_choices = [](const YamlContext& ctx) { return ctx.transform_names(); };
  f->read = [](YamlContext& ctx) {
    const Params& p = ctx.params();
    const std::string& fn = p.string("fn");
    const TransformSchema* t = ctx.transform(fn);
    if (t == nullptr) throw ConfigError("fn", "unknown transform '" + fn + "'");
    MapOptions o;
    o.name = fn;
    if (auto w = p.optional_uint("workers")) o.workers = static_cast<int>(*w);
    o.params = p.describe(t->params);
    if (ctx.after_batch()) {
      if (!t->make_batch)
        throw ConfigError(
            "fn", "transform '" + fn + "' works on single samples; put this map before batch");
      o.batch_fn = t->make_batch(p);
      ctx.add(batch_map_node(), std::move(o));
    } else {
      o.fn = t->make_sample(p);
      ctx.add(map_node(), std::move(o));
    }
  };
  return f;
}

}  // namespace

const NodeDef& map_node() {
  static const NodeDef def = [] {
    NodeDef d = define_node<MapOptions>(
        {.type = "map",
         .phase = Phase::kPerSample,
         .doc = "applies a function to every sample (before batch) or batch (after it)"},
        [](BuildContext& ctx, const MapOptions& o) { ctx.add_sample_map(o.fn); });
    d.yaml = map_yaml(d);
    return d;
  }();
  return def;
}

const NodeDef& batch_map_node() {
  static const NodeDef def = define_node<MapOptions>(
      {.type = "map", .phase = Phase::kPerBatch, .doc = map_node().doc},
      [](BuildContext& ctx, const MapOptions& o) { ctx.add_batch_map(o.batch_fn); });
  return def;
}

}  // namespace flowstate
