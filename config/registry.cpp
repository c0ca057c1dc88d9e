#include "flowstate/config/registry.h"

#include <mutex>
#include <stdexcept>

#include "flowstate/core/error.h"

namespace flowstate {

// ---- Registry ----

void Registry::add(NodeSchema schema) {
  if (schema.type.empty()) throw std::invalid_argument("Registry::add: a node type needs a name");
  if (find(schema.type) != nullptr)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' is already registered");
  if (!schema.add && schema.def == nullptr)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' has no build function");
  nodes_.push_back(std::move(schema));
}

const NodeSchema* Registry::find(std::string_view type) const {
  for (const auto& n : nodes_)
    if (n.type == type) return &n;
  return nullptr;
}

std::vector<std::string> Registry::names(bool sources) const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    if (n.source == sources && n.add) out.push_back(n.type);
  return out;
}

Registry Registry::with_builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

const Registry& Registry::builtin() {
  static const Registry r = with_builtins();
  return r;
}

void Registry::add(const NodeDef& def, std::string origin) {
  NodeSchema n;
  n.type = def.type;
  n.doc = def.doc;
  n.source = def.phase == Phase::kSource;
  n.params = def.params;
  n.def = &def;
  n.origin = std::move(origin);
  if (def.from_params) {
    n.add = [&def](NodeContext& ctx) {
      ctx.builder.add(def, def.from_params(ctx.params, ctx.base_dir));
    };
  }
  add(std::move(n));
}

Registry& Registry::global() {
  static Registry r = with_builtins();
  return r;
}

const std::vector<ParamSchema>& pipeline_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "seed",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "the pipeline seed; shuffles and map generators derive from it"},
      {.name = "workers",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{2},
       .doc = "parallel workers reading, mapping and collating batches; auto: tuned while "
              "running",
       .min = 1,
       .max = 1024,
       .free = true,
       .auto_value = true},
      {.name = "epochs",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{1},
       .doc = "epochs to run; 0 runs until stopped"},
  };
  return params;
}

const std::vector<ParamSchema>& checkpoint_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "dir",
       .type = ParamType::kString,
       .doc = "directory of the step-N checkpoints; relative to the YAML file",
       .required = true,
       .check = [](const ParamValue& v) -> std::string {
         return std::get<std::string>(v).empty() ? "must not be empty" : "";
       }},
      {.name = "every_steps",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "write a checkpoint after each batch whose (step + 1) is a multiple; 0: only at "
              "the end of a run and on SIGTERM/SIGINT"},
      {.name = "keep",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "newest checkpoints to keep; 0 keeps all"},
  };
  return params;
}

}  // namespace flowstate
