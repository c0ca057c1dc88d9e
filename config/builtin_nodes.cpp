// The built-in node types. Most are registered by their definition alone; map, filter and mix
// add a YAML form of their own, because their YAML parameters name things only config knows:
// a transform (map), a named predicate (filter) and input pipeline files (mix).
#include <charconv>
#include <cmath>
#include <cstring>

#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/indexed.h"
#include "flowstate/nodes/sources/iterable.h"

namespace flowstate {
namespace {

NodeSchema map_schema() {
  NodeSchema n;
  n.type = "map";
  n.doc = "applies a named transform to every sample (before batch) or batch (after it)";
  n.def = &map_node();
  n.params = map_node().params;  // fn and workers; in YAML fn names a transform
  n.params[0].required = true;
  n.params[0].default_value.reset();
  n.params[0].doc = "the transform (see the transforms below); its parameters go beside fn";
  n.dispatch = "fn";
  n.extra_params = [](const TransformRegistry& t,
                      const std::string& fn) -> const std::vector<ParamSchema>* {
    const TransformSchema* s = t.find(fn);
    return s != nullptr ? &s->params : nullptr;
  };
  n.dispatch_choices = [](const TransformRegistry& t) { return t.names(); };
  n.node_name = [](const Params& p) { return p.string("fn"); };  // MapOptions::name
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    const std::string& fn = p.string("fn");
    const TransformSchema* t = ctx.transforms.find(fn);
    if (t == nullptr) throw ConfigError("fn", "unknown transform '" + fn + "'");
    MapOptions o;
    o.name = fn;
    if (auto w = p.optional_uint("workers")) o.workers = static_cast<int>(*w);
    o.params = p.describe(t->params);
    if (ctx.after_batch) {
      if (!t->make_batch)
        throw ConfigError(
            "fn", "transform '" + fn + "' works on single samples; put this map before batch");
      ctx.builder.map_batch(t->make_batch(p), std::move(o));
    } else {
      ctx.builder.map(t->make_sample(p), std::move(o));
    }
  };
  return n;
}

/// A 1-D view of a field's values as doubles (the first element of a scalar).
double first_value(const Tensor& t, const std::string& field) {
  if (t.numel() == 0) throw DataError("", DataError::kNoOffset, "field '" + field + "' is empty");
  return visit_dtype(t.dtype(), [&]<class T>() {
    T v;
    std::memcpy(&v, t.data(), sizeof(T));
    return static_cast<double>(v);
  });
}

const std::vector<ParamSchema>& filter_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "fn",
       .type = ParamType::kString,
       .doc = "length: the field's first dimension in [min, max]; value: its first element in "
              "[min, max]; keep_fraction: a seeded coin per sample and epoch",
       .required = true,
       .choices = {"length", "value", "keep_fraction"}},
      {.name = "field", .type = ParamType::kString, .doc = "the field (length, value)"},
      {.name = "min", .type = ParamType::kFloat, .doc = "inclusive lower bound (length, value)"},
      {.name = "max", .type = ParamType::kFloat, .doc = "inclusive upper bound (length, value)"},
      {.name = "fraction",
       .type = ParamType::kFloat,
       .doc = "keep_fraction: the share of samples kept",
       .min = 0,
       .max = 1},
  };
  return params;
}

NodeSchema filter_schema() {
  NodeSchema n;
  n.type = "filter";
  n.doc = "drops samples a named predicate rejects; batches stay full and resume stays exact";
  n.def = &filter_node();
  n.params = filter_params();
  n.node_name = [](const Params& p) { return p.string("fn"); };
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    const std::string fn = p.string("fn");
    FilterOptions o{.name = fn, .params = p.describe(filter_params())};
    std::erase_if(o.params, [](const DescribedParam& d) { return d.key == "fn"; });
    if (fn == "keep_fraction") {
      if (!p.has("fraction")) throw ConfigError("fraction", "keep_fraction needs a fraction");
      const double f = p.real("fraction");
      ctx.builder.filter(
          [f](const Sample&, MapContext& c) {
            return static_cast<double>(c.rng() >> 11) * 0x1p-53 < f;
          },
          std::move(o));
      return;
    }
    if (!p.has("field")) throw ConfigError("field", fn + " needs a field");
    if (!p.has("min") && !p.has("max")) throw ConfigError("min", fn + " needs min or max");
    const std::string field = p.string("field");
    const double lo = p.has("min") ? p.real("min") : -HUGE_VAL;
    const double hi = p.has("max") ? p.real("max") : HUGE_VAL;
    const FieldId id = field_id(field);
    const bool length = fn == "length";
    if (length) o.by_length = LengthRule{.field = id, .min = lo, .max = hi};
    ctx.builder.filter(
        [=](const Sample& s, MapContext&) {
          const Tensor* t = s.find(id);
          if (t == nullptr)
            throw DataError("", DataError::kNoOffset,
                            "record " + s.ref.to_string() + " has no field '" + field + "'");
          const double v = length
                               ? (t->shape().rank() == 0 ? 1.0 : static_cast<double>(t->shape()[0]))
                               : first_value(*t, field);
          return v >= lo && v <= hi;
        },
        std::move(o));
  };
  return n;
}

NodeSchema mix_schema() {
  NodeSchema n;
  n.type = "mix";
  n.doc = "samples from several input pipelines (YAML files without batch) by weight";
  n.source = true;
  n.params = {
      {.name = "inputs",
       .type = ParamType::kStringList,
       .doc = "input pipeline files (source, shard, shuffle, filter, maps); relative to this file",
       .required = true,
       .check = check_paths},
      {.name = "weights",
       .type = ParamType::kStringList,
       .doc = "one positive number per input",
       .required = true},
  };
  for (const auto& p : mix_node().params) n.params.push_back(p);  // stop
  n.def = &mix_node();
  n.add = [](NodeContext& ctx) {
    const Params& p = ctx.params;
    MixOptions o;
    const auto& ws = p.strings("weights");
    for (std::size_t i = 0; i < ws.size(); ++i) {
      double w = 0;
      auto [end, ec] = std::from_chars(ws[i].data(), ws[i].data() + ws[i].size(), w);
      if (ec != std::errc() || end != ws[i].data() + ws[i].size() || !(w > 0) || !std::isfinite(w))
        throw ConfigError("weights", "weights[" + std::to_string(i) + "]: '" + ws[i] +
                                         "' is not a positive number");
      o.weights.push_back(w);
    }
    o.stop = options_from<MixOptions>(p).stop;
    std::vector<Pipeline> inputs;
    for (const auto& path : p.strings("inputs")) {
      std::filesystem::path f(path);
      if (f.is_relative() && !ctx.base_dir.empty()) f = ctx.base_dir / f;
      inputs.push_back(from_yaml_file(f.string(), {.mix_input = true}));
    }
    ctx.builder.mix(std::move(inputs), std::move(o));
  };
  return n;
}

}  // namespace

void register_builtin_nodes(Registry& registry) {
  registry.add(records_node());
  registry.add(lines_node());
  registry.add(tar_node());
  registry.add(indexed_node());
  registry.add(shard_node());
  registry.add(shuffle_node());
  registry.add(mix_schema());
  registry.add(map_schema());
  registry.add(filter_schema());
  registry.add(pack_node());
  registry.add(batch_node());
  registry.add(prefetch_node());
  registry.add(device_copy_node());
  registry.add(iterable_node());
}

}  // namespace flowstate
