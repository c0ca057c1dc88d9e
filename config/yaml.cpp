#include "flowstate/config/yaml.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "flowstate/config/plugins.h"
#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"
#include "flowstate/config/yaml_params.h"
#include "flowstate/config/yaml_support.h"
#include "flowstate/core/error.h"

namespace flowstate {
namespace {

using namespace yaml_support;

/// The most nodes a YAML pipeline may have: far above any real pipeline, and it keeps a file
/// of aliases that expand to millions of nodes from running for minutes.
constexpr std::size_t kMaxNodes = 10000;

/// A node of `nodes:` (or the source) after its structure was checked.
struct NodeEntry {
  const NodeSchema* schema = nullptr;
  std::string key;       ///< "nodes[2].shuffle" or "source"
  std::string list_key;  ///< "nodes[2]" or "source"
  YAML::Node at;         ///< the entry, for messages about the node as a whole
  Params params;
};

class YamlLoader {
 public:
  YamlLoader(std::string origin, const YamlOptions& options, std::filesystem::path base_dir)
      : origin_(origin),
        in_(std::move(origin)),
        options_(options),
        base_dir_(std::move(base_dir)),
        registry_(options.registry != nullptr ? *options.registry : Registry::global()),
        transforms_(options.transforms != nullptr ? *options.transforms
                                                  : TransformRegistry::global()) {}

  PipelineConfig load(std::string_view text) {
    YAML::Node root;
    try {
      const std::string input(text);
      const std::vector<YAML::Mark> starts = document_starts(input, 2);
      root = YAML::Load(input);
      if (starts.empty() || root.IsNull())
        throw ConfigError("", origin_ +
                                  ": the pipeline is empty (expected a map with source, "
                                  "nodes, ...)");
      if (starts.size() > 1) {
        if (starts[1].pos <= starts[0].pos)
          throw ConfigError("", location(starts[1]) + ": invalid YAML: unexpected content");
        throw ConfigError("", location(starts[1]) +
                                  ": a pipeline file holds one YAML document, and another one "
                                  "starts here");
      }
    } catch (const YAML::Exception& e) {
      throw ConfigError("", location(e.mark) + ": invalid YAML: " + e.msg);
    }
    try {
      for (const auto& o : options_.overrides) in_.add_override(apply_override(root, o));
      return interpret(root);
    } catch (const YAML::Exception& e) {
      // Not expected from a checked tree; still a configuration problem, never a crash.
      throw ConfigError("", location(e.mark) + ": " + e.msg);
    }
  }

 private:
  // ---- errors, values and parameter maps: config/yaml_params.h ----

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& message) const {
    in_.fail(at, key, message);
  }
  std::string location(const YAML::Mark& m) const { return in_.location(m); }
  Params parse_params(const YAML::Node& map, const YAML::Node& at, const std::string& key,
                      const std::vector<const std::vector<ParamSchema>*>& schemas,
                      const std::string& what, const std::set<std::string>& ignore = {}) const {
    return in_.parse_params(map, at, key, schemas, what, ignore);
  }
  static const ParamSchema* find_param(const std::vector<const std::vector<ParamSchema>*>& schemas,
                                       const std::string& name) {
    return YamlParams::find_param(schemas, name);
  }

  /// Validates a node's parameters, resolving a dispatching parameter (map's `fn`) first.
  Params node_params(const NodeSchema& schema, const YAML::Node& map, const YAML::Node& at,
                     const std::string& key, const std::string& what,
                     const std::set<std::string>& ignore = {}) const {
    std::vector<const std::vector<ParamSchema>*> schemas{&schema.params};
    if (!schema.dispatch.empty() && schema.extra_params) {
      std::optional<YAML::Node> d;
      if (map.IsMap()) d = child(map, schema.dispatch);
      if (d) {
        const std::string dkey = key + "." + schema.dispatch;
        if (!d->IsScalar()) fail(*d, dkey, "expected a string, got " + describe_node(*d));
        const auto* extra = schema.extra_params(transforms_, d->Scalar());
        if (extra == nullptr) {
          std::vector<std::string> known = schema.dispatch_choices
                                               ? schema.dispatch_choices(transforms_)
                                               : std::vector<std::string>{};
          fail(*d, dkey,
               "unknown " + schema.dispatch_what + " '" + d->Scalar() + "' (known: " + join(known) +
                   ")" + suggestion(d->Scalar(), known));
        }
        schemas.push_back(extra);
      }
    }
    return parse_params(map, at, key, schemas, what, ignore);
  }

  // ---- the pipeline ----

  PipelineConfig interpret(const YAML::Node& root) {
    if (!root.IsMap())
      fail(root, "",
           "a pipeline is a map with the keys seed, source, nodes, ... (got " +
               describe_node(root) + ")");
    const std::vector<std::string>& kTop = top_level_keys();
    YAML::Node source, nodes, checkpoint, plugins;
    bool has_source = false, has_nodes = false, has_checkpoint = false, has_plugins = false;
    std::set<std::string> seen;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node k(it->first);
      if (!k.IsScalar()) fail(k, "", "keys must be strings, got " + describe_node(k));
      const std::string name = k.Scalar();
      if (!seen.insert(name).second) fail(k, name, "duplicate key '" + name + "'");
      if (name == "source") {
        source.reset(it->second);
        source_key_.reset(k);
        has_source = true;
      } else if (name == "nodes") {
        nodes.reset(it->second);
        nodes_key_.reset(k);
        has_nodes = true;
      } else if (name == "checkpoint") {
        checkpoint.reset(it->second);
        checkpoint_key_.reset(k);
        has_checkpoint = true;
      } else if (name == "plugins") {
        plugins.reset(it->second);
        has_plugins = true;
      } else if (std::find(kTop.begin(), kTop.end(), name) == kTop.end()) {
        fail(k, name,
             "unknown top-level key '" + name + "' (known: " + join(kTop) + ")" +
                 suggestion(name, kTop));
      }
    }
    Params top = parse_params(root, root, "", {&pipeline_params()}, "the pipeline",
                              {"source", "nodes", "checkpoint", "plugins"});
    // Plugins first: they add the node types the rest may name.
    if (has_plugins) load_plugins(plugins);

    std::vector<NodeEntry> entries;
    if (!has_source)
      fail(root, "source", "missing required key 'source' (e.g. source: {type: records, ...})");
    entries.push_back(source_entry(source));
    // A mix input may be a bare source.
    if (!has_nodes && !options_.mix_input)
      fail(root, "nodes", "missing required key 'nodes' (a pipeline needs at least a batch node)");
    if (has_nodes && !nodes.IsSequence())
      fail(nodes.IsNull() ? nodes_key_ : nodes, "nodes",
           "expected a list of nodes, got " + describe_node(nodes));
    if (has_nodes && nodes.size() > kMaxNodes)
      fail(nodes, "nodes",
           "the pipeline has " + std::to_string(nodes.size()) + " nodes; at most " +
               std::to_string(kMaxNodes) + " are allowed");
    if (has_nodes)
      for (std::size_t i = 0; i < nodes.size(); ++i) entries.push_back(node_entry(nodes[i], i));

    PipelineConfig config;
    config.origin = origin_;
    config.epochs = top.uint("epochs");
    if (has_checkpoint) {
      Params c = parse_params(checkpoint.IsNull() ? YAML::Node() : checkpoint,
                              checkpoint.IsNull() ? checkpoint_key_ : checkpoint, "checkpoint",
                              {&checkpoint_params()}, "checkpoint");
      CheckpointConfig cc;
      std::filesystem::path dir(c.string("dir"));
      cc.dir = dir.is_relative() && !base_dir_.empty() ? (base_dir_ / dir).string() : dir.string();
      cc.every_steps = c.uint("every_steps");
      cc.keep = static_cast<std::size_t>(c.uint("keep"));
      config.checkpoint = cc;
    }
    config.pipeline = build(entries, top, nodes);
    return config;
  }

  /// Loads the libraries of `plugins:` (a path or a list; relative to the YAML file).
  void load_plugins(const YAML::Node& plugins) const {
    ParamSchema schema{.name = "plugins", .type = ParamType::kStringList, .doc = "plugins"};
    const ParamValue v = in_.parse_value(plugins, schema, "plugins");
    const auto& paths = std::get<std::vector<std::string>>(v);
    for (std::size_t i = 0; i < paths.size(); ++i) {
      std::filesystem::path f(paths[i]);
      if (f.is_relative() && !base_dir_.empty()) f = base_dir_ / f;
      try {
        load_plugin(f.string());
      } catch (const ConfigError& e) {
        const YAML::Node at = plugins.IsSequence() ? plugins[i] : plugins;
        fail(at, plugins.IsSequence() ? "plugins[" + std::to_string(i) + "]" : "plugins", e.what());
      }
    }
  }

  NodeEntry source_entry(const YAML::Node& source) const {
    const std::vector<std::string> sources = registry_.names(true);
    if (!source.IsMap())
      fail(source.IsNull() ? source_key_ : source, "source",
           "expected a map like {type: records, ...}, got " + describe_node(source));
    std::optional<YAML::Node> type = child(source, "type");
    if (!type)
      fail(source, "source.type", "missing required key 'type' (known: " + join(sources) + ")");
    if (!type->IsScalar())
      fail(*type, "source.type", "expected a source type, got " + describe_node(*type));
    const std::string name = type->Scalar();
    const NodeSchema* schema = registry_.find(name);
    if (schema == nullptr)
      fail(*type, "source.type",
           "unknown source type '" + name + "' (known: " + join(sources) + ")" +
               suggestion(name, sources));
    if (!schema->source)
      fail(*type, "source.type",
           "'" + name + "' is not a source (sources: " + join(sources) + "); put it in nodes");
    NodeEntry e;
    e.schema = schema;
    e.key = "source";
    e.list_key = "source";
    e.at = source;
    e.params = node_params(*schema, source, source, "source", name + " source", {"type"});
    return e;
  }

  NodeEntry node_entry(const YAML::Node& n, std::size_t i) const {
    const std::string list_key = "nodes[" + std::to_string(i) + "]";
    YAML::Node type_node, params;
    if (n.IsScalar()) {
      type_node.reset(n);
    } else if (n.IsMap() && n.size() == 1) {
      type_node.reset(n.begin()->first);
      params.reset(n.begin()->second);
      if (!type_node.IsScalar())
        fail(type_node, list_key, "a node type is a string, got " + describe_node(type_node));
    } else {
      std::string got =
          n.IsMap() ? "a map with " + std::to_string(n.size()) + " keys" : describe_node(n);
      fail(n, list_key, "a node is a one-key map like '- shuffle: {size: 1024}', got " + got);
    }
    const std::string type = type_node.Scalar();
    const NodeSchema* schema = registry_.find(type);
    const std::vector<std::string> known = registry_.names(false);
    if (schema == nullptr)
      fail(type_node, list_key,
           "unknown node type '" + type + "' (known: " + join(known) + ")" +
               suggestion(type, known));
    if (schema->source)
      fail(type_node, list_key, "'" + type + "' is a source; it goes under 'source:'");
    NodeEntry e;
    e.schema = schema;
    e.key = list_key + "." + type;
    e.list_key = list_key;
    e.at = n;
    e.params = node_params(*schema, params, n.IsMap() ? type_node : n, e.key, type);
    return e;
  }

  Pipeline build(const std::vector<NodeEntry>& entries, const Params& top,
                 const YAML::Node& nodes) const {
    Pipeline::Builder b;
    b.seed(top.uint("seed"));
    b.workers(static_cast<int>(top.uint("workers")));
    // The builder names nodes by type (or a map by its transform), made unique with "#k":
    // the same names here place its errors, which name nodes, at their entries.
    bool after_batch = false;
    for (const NodeEntry& e : entries) {
      NodeContext ctx{b, e.params, base_dir_, transforms_, after_batch, &registry_};
      if (!e.schema->add)
        fail(e.at, e.key,
             "'" + e.schema->type +
                 "' is made in C++ (from_range, from_producer) and cannot be "
                 "written in YAML");
      try {
        e.schema->add(ctx);
      } catch (const ConfigError& err) {
        rethrow_at(e, err);
      }
      after_batch =
          after_batch || (!b.nodes().empty() && b.nodes().back().phase() == Phase::kBatch);
    }
    // The builder's placement rules (every node's Placement, one batch node), worded with the
    // entries' keys.
    PlacementWords words;
    words.node = [&](std::size_t i) { return i < entries.size() ? entries[i].list_key : ""; };
    words.missing_batch = [this] {
      std::string example;
      for (const auto& n : registry_.nodes())
        if (n.def != nullptr && n.def->phase == Phase::kBatch && !n.def->yaml_example.empty())
          example = n.def->yaml_example;
      return "a pipeline needs a batch node" + (example.empty() ? "" : " (e.g. '" + example + "')");
    };
    try {
      return options_.mix_input ? b.build_input(words) : b.build(words);
    } catch (const ConfigError& err) {
      // The builder names nodes (by type, or a map by its transform, unique with "#k"): its
      // nodes are the entries, in order. A rule about the whole pipeline is placed at its nodes.
      const auto& built = b.nodes();
      for (std::size_t i = 0; i < built.size() && i < entries.size(); ++i)
        if (built[i].name == err.key()) fail(entries[i].at, entries[i].key, err.what());
      fail(nodes.IsSequence() && nodes.size() > 0 ? nodes : nodes_key_, "nodes", err.what());
    }
  }

  /// Rethrows a node's own ConfigError with the full key path and the location.
  /// True when `name` is a parameter of the entry's dispatch value (a predicate's `field`).
  bool dispatched_param(const NodeEntry& e, const std::string& name) const {
    if (e.schema->dispatch.empty() || !e.schema->extra_params) return false;
    const ParamValue* d = e.params.find(e.schema->dispatch);
    const auto* value = d != nullptr ? std::get_if<std::string>(d) : nullptr;
    if (value == nullptr) return false;
    const auto* extra = e.schema->extra_params(transforms_, *value);
    return extra != nullptr && find_param({extra}, name) != nullptr;
  }

  [[noreturn]] void rethrow_at(const NodeEntry& e, const ConfigError& err) const {
    const std::string& k = err.key();
    const std::string& type = e.schema->type;
    // A transform's param_error is complete: a full key, already located.
    if ((k == e.key || k.rfind(e.key + ".", 0) == 0) &&
        std::string_view(err.what()).find(k + ": ") != std::string_view::npos)
      throw err;
    std::string param;
    if (k.rfind(e.key + ".", 0) == 0)
      param = k.substr(e.key.size() + 1);
    else if (k.rfind(type + ".", 0) == 0)
      param = k.substr(type.size() + 1);
    else if (k != type && (e.params.has(k) || find_param({&e.schema->params}, k) != nullptr ||
                           dispatched_param(e, k)))
      param = k;
    const std::string full = param.empty() ? e.key : e.key + "." + param;
    throw ConfigError(full, e.params.where(param) + ": " + full + ": " + err.what());
  }

  std::string origin_;
  YamlParams in_;  ///< reads values and parameter maps, and words errors at their place
  const YamlOptions& options_;
  std::filesystem::path base_dir_;
  const Registry& registry_;
  const TransformRegistry& transforms_;
  YAML::Node source_key_, nodes_key_, checkpoint_key_;
};

}  // namespace

PipelineConfig load_yaml_string(std::string_view text, const std::string& origin,
                                const YamlOptions& options) {
  YamlLoader loader(origin, options, options.base_dir.value_or(std::filesystem::path()));
  return loader.load(text);
}

PipelineConfig load_yaml_file(const std::string& path, const YamlOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("", "cannot read pipeline '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("", "cannot read pipeline '" + path + "': read error");
  std::filesystem::path base = options.base_dir.value_or(std::filesystem::path(path).parent_path());
  YamlLoader loader(path, options, base);
  return loader.load(text.str());
}

Pipeline from_yaml_file(const std::string& path, const YamlOptions& options) {
  return load_yaml_file(path, options).pipeline;
}

Pipeline from_yaml_string(std::string_view text, const std::string& origin,
                          const YamlOptions& options) {
  return load_yaml_string(text, origin, options).pipeline;
}

}  // namespace flowstate
