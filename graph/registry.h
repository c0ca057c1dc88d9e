// The node registry: every node type a YAML pipeline may name ("records", "shuffle", ...),
// each with a parameter schema (name, type, default, one-line doc, range or choices, free or
// not). The YAML loader validates against it, `flowstate validate` fills in defaults from it
// and `flowstate schema` prints it. Registration is explicit: register_builtin_nodes() is the
// one place the built-in nodes are added; a program adds its own nodes the same way.
//
//   Registry r = Registry::with_builtins();
//   r.add({.type = "tag", .doc = "adds a constant field",
//          .params = {{.name = "value", .type = ParamType::kInt, .doc = "the value",
//                      .required = true}},
//          .add = [](NodeContext& ctx) { ctx.builder.map(..., {.name = "tag"}); }});
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

#include "graph/pipeline.h"
#include "nodes/node.h"

namespace flowstate {

class TransformRegistry;

/// The type of a parameter value.
enum class ParamType : std::uint8_t {
  kBool,        ///< true / false
  kUInt,        ///< a non-negative 64-bit integer
  kInt,         ///< a signed 64-bit integer
  kFloat,       ///< a finite number
  kString,      ///< any scalar, as text
  kStringList,  ///< a string or a list of strings
  kIntList,     ///< an integer or a list of integers
};
/// "an unsigned integer", "a boolean", ...: what a value of type `t` is, for messages.
std::string_view param_type_name(ParamType t);

/// A parameter value; the alternative matches the ParamType (kUInt: uint64_t, kInt: int64_t,
/// kFloat: double, kStringList: vector<string>, kIntList: vector<int64_t>).
using ParamValue = std::variant<bool, std::uint64_t, std::int64_t, double, std::string,
                                std::vector<std::string>, std::vector<std::int64_t>>;
/// The canonical text of a value: "true", "42", "0.5", "text", "[a, b]", "[256, 2]".
std::string format_param(const ParamValue& value);

/// One parameter of a node, a transform or the pipeline.
struct ParamSchema {
  std::string name;
  ParamType type = ParamType::kString;
  /// Filled in when the parameter is absent. None: required, or left unset (see default_doc).
  std::optional<ParamValue> default_value;
  std::string doc;  ///< one line
  bool required = false;
  /// Inclusive bounds of numbers (of each element, for kIntList). Doubles: exact for every
  /// bound a schema needs.
  std::optional<double> min;
  std::optional<double> max;
  /// The values a kString accepts; empty: any.
  std::vector<std::string> choices;
  /// A free parameter never changes the output (worker counts, depths, devices); it is left
  /// out of the fingerprint.
  bool free = false;
  /// What an unset parameter without a default means ("RANK, ... else 0"), for the docs.
  std::string default_doc;
  /// Extra validation: returns the problem ("must not be empty"), or "" when the value is fine.
  std::function<std::string(const ParamValue&)> check;
};

/// The validated parameters of one node: every parameter of its schema that was given or
/// has a default. Accessors throw std::logic_error on a name or type the schema does not
/// declare (a bug in the node, not in the user's pipeline).
class Params {
 public:
  Params() = default;
  /// `key` is the node's key path ("nodes[2].shuffle"); `where` maps a parameter name (or ""
  /// for the node itself) to its source location ("pipeline.yaml:4:15"), used in messages.
  Params(std::string key, std::vector<std::pair<std::string, ParamValue>> values,
         std::vector<std::pair<std::string, std::string>> where = {});

  bool has(std::string_view name) const { return find(name) != nullptr; }
  /// True when the parameter was written (not filled in from its default).
  bool given(std::string_view name) const;
  const ParamValue* find(std::string_view name) const;
  bool boolean(std::string_view name) const { return get<bool>(name); }
  std::uint64_t uint(std::string_view name) const { return get<std::uint64_t>(name); }
  std::int64_t integer(std::string_view name) const { return get<std::int64_t>(name); }
  double real(std::string_view name) const { return get<double>(name); }
  const std::string& string(std::string_view name) const { return get<std::string>(name); }
  const std::vector<std::string>& strings(std::string_view name) const {
    return get<std::vector<std::string>>(name);
  }
  const std::vector<std::int64_t>& ints(std::string_view name) const {
    return get<std::vector<std::int64_t>>(name);
  }
  std::optional<std::uint64_t> optional_uint(std::string_view name) const;

  /// The node's key path ("nodes[2].shuffle"); `key("size")` is "nodes[2].shuffle.size".
  const std::string& key() const { return key_; }
  std::string key(std::string_view param) const;
  /// "file:line:col" of a parameter (or of the node when the parameter was not written).
  std::string where(std::string_view param = {}) const;

  /// The parameters of `schema` that are set, in schema order, as described parameters
  /// (free ones marked): what a node puts into its NodeDescription.
  std::vector<DescribedParam> describe(const std::vector<ParamSchema>& schema) const;

  const std::vector<std::pair<std::string, ParamValue>>& values() const { return values_; }

 private:
  template <class T>
  const T& get(std::string_view name) const;

  std::string key_;
  std::vector<std::pair<std::string, ParamValue>> values_;
  std::vector<std::pair<std::string, std::string>> where_;
};

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
};

/// A registered node type.
struct NodeSchema {
  std::string type;     ///< the name used in YAML; also the type of the node's description
  std::string doc;      ///< one line
  bool source = false;  ///< sources go under `source:` (with `type:`), others under `nodes:`
  std::vector<ParamSchema> params;
  /// For a node whose other parameters depend on one of its own (map: `fn`): that
  /// parameter's name, and the extra parameters for a value of it (null for an unknown value,
  /// whose error lists `dispatch_choices`).
  std::string dispatch;
  std::function<const std::vector<ParamSchema>*(const TransformRegistry&, const std::string&)>
      extra_params;
  std::function<std::vector<std::string>(const TransformRegistry&)> dispatch_choices;
  /// Adds exactly one node, whose description's type is `type`, to ctx.builder. May throw
  /// ConfigError with a key relative to the node ("size" or "shuffle.size") or a full key.
  std::function<void(NodeContext& ctx)> add;
  /// The name `add` asks the builder for (before "#2" suffixes), when it is not `type`: the
  /// YAML loader uses it to place the builder's errors, which name nodes.
  std::function<std::string(const Params&)> node_name;
};

/// Node types by name, in registration order. Safe to read from many threads once built.
class Registry {
 public:
  /// A registry holding the built-in node types.
  static Registry with_builtins();
  /// The shared built-in registry (built on first use; immutable).
  static const Registry& builtin();

  /// Registers a node type; throws std::invalid_argument when the name is empty or taken, or
  /// when `add` is missing.
  void add(NodeSchema schema);
  /// The schema of `type`, or null.
  const NodeSchema* find(std::string_view type) const;
  /// Every registered node type, in registration order.
  const std::vector<NodeSchema>& nodes() const { return nodes_; }
  /// Registered type names of sources (`sources` true) or of the other nodes.
  std::vector<std::string> names(bool sources) const;

 private:
  std::vector<NodeSchema> nodes_;
};

/// Registers records, shard, shuffle, map, batch, prefetch and device_copy.
void register_builtin_nodes(Registry& registry);

/// The top-level scalar keys of a YAML pipeline: seed, workers, epochs.
const std::vector<ParamSchema>& pipeline_params();
/// The keys of the `checkpoint:` section: dir, every_steps, keep.
const std::vector<ParamSchema>& checkpoint_params();

/// Checks `value` against `p`'s range, choices and check; returns the problem or "".
std::string check_param(const ParamSchema& p, const ParamValue& value);
/// Checks the number `value`, written as `text`, against `p`'s bounds; returns the problem
/// ("300 is out of range (must be between 1 and 255)") or "".
std::string check_number(const ParamSchema& p, double value, const std::string& text);

/// Documentation of a parameter list, one line per parameter, for `flowstate schema`.
std::string describe_params(const std::vector<ParamSchema>& params, std::string_view indent);

}  // namespace flowstate
