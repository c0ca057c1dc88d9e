// The registry: every node type a YAML pipeline may name ("records", "shuffle", "take"), as
// YAML and `flowstate schema` see it. A node type is its definition (nodes/definition.h):
// schema, checks and YAML reading all derive from its options table, or from its own YAML form
// (NodeDef::yaml: map's transform, filter's named predicate, mix's input files). A program may
// also register a YAML-only entry (NodeSchema with its own `add`).
// Registration is explicit: register_builtin_nodes() adds the built-in nodes; a program adds
// its own with Registry::add(definition), and a plugin library does the same from its
// `flowstate_register_plugin` (config/plugins.h).
//
//   Registry r = Registry::with_builtins();
//   r.add(take_node());
//   Pipeline p = from_yaml_file("pipeline.yaml", {.registry = &r});
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/params.h"

namespace flowstate {

class TransformRegistry;

/// What a node's build function gets: the builder to add exactly one node to, the node's
/// validated parameters, and context.
struct NodeContext {
  Pipeline::Builder& builder;
  const Params& params;
  /// Relative file paths in parameters resolve against this directory (the YAML file's).
  std::filesystem::path base_dir;
  const TransformRegistry& transforms;
  /// True when a `batch` node comes before this one (a map then works on whole batches).
  bool after_batch = false;
  /// The caller's node registry: a mix's inputs are read with it (null: Registry::global()).
  const class Registry* registry = nullptr;
};

/// A registered node type.
struct NodeSchema {
  std::string type;     ///< the name used in YAML; also the type of the node's description
  std::string doc;      ///< one line
  bool source = false;  ///< sources go under `source:` (with `type:`), others under `nodes:`
  std::vector<ParamSchema> params;
  /// The node's definition: how `inspect` reads its state (null: a YAML-only type).
  const NodeDef* def = nullptr;
  /// The plugin library that registered it; empty for a built-in or the program's own.
  std::string origin;
  /// For a node whose other parameters depend on one of its own (map: `fn`): that
  /// parameter's name, and the extra parameters for a value of it (null for an unknown value,
  /// whose error lists `dispatch_choices`).
  std::string dispatch;
  /// What a dispatch value names ("transform", "predicate"), for messages.
  std::string dispatch_what = "transform";
  std::function<const std::vector<ParamSchema>*(const TransformRegistry&, const std::string&)>
      extra_params;
  std::function<std::vector<std::string>(const TransformRegistry&)> dispatch_choices;
  /// Adds exactly one node, whose description's type is `type`, to ctx.builder. May throw
  /// ConfigError with a key relative to the node ("size" or "shuffle.size") or a full key.
  /// Null for a type that YAML cannot make (a C++-only source kept for `inspect`).
  std::function<void(NodeContext& ctx)> add;
  /// Unused: kept so that programs which set it still compile. The YAML loader places the
  /// builder's errors by the names of the nodes `add` added.
  std::function<std::string(const Params&)> node_name;
};

/// Node types by name, in registration order. Safe to read from many threads once built.
class Registry {
 public:
  /// A registry holding the built-in node types.
  static Registry with_builtins();
  /// The shared built-in registry (built on first use; immutable).
  static const Registry& builtin();
  /// The process's registry: the built-ins plus every node a loaded plugin registered. What
  /// YAML and the command use when no registry is given. Plugins are loaded at start-up,
  /// before pipelines are read from several threads.
  static Registry& global();

  /// Registers a node type; throws std::invalid_argument when the name is empty or taken.
  void add(NodeSchema schema);
  /// Registers a node by its definition: YAML parameters, checks and reading all come from
  /// the definition's options table. A definition without YAML reading (from_params null) is
  /// known to `inspect` only.
  void add(const NodeDef& def, std::string origin = {});
  /// The schema of `type`, or null.
  const NodeSchema* find(std::string_view type) const;
  /// Every registered node type, in registration order.
  const std::vector<NodeSchema>& nodes() const { return nodes_; }
  /// Registered type names YAML can use: of sources (`sources` true) or of the other nodes.
  std::vector<std::string> names(bool sources) const;

 private:
  std::vector<NodeSchema> nodes_;
};

/// Registers the built-in nodes: records, lines, tar, mix, shard, shuffle, map, filter, pack,
/// batch, prefetch, device_copy (and iterable, for `inspect`).
void register_builtin_nodes(Registry& registry);

/// The top-level scalar keys of a YAML pipeline: seed, workers, epochs.
const std::vector<ParamSchema>& pipeline_params();
/// The keys of the `checkpoint:` section: dir, every_steps, keep.
const std::vector<ParamSchema>& checkpoint_params();

}  // namespace flowstate
