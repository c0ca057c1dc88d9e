// A node's one definition: everything the rest of flowstate knows about a node type — its
// name, phase, doc, options table (nodes/options.h), how it builds itself into a running
// spine, and how its saved state reads back for `flowstate inspect`. The C++ builder, YAML
// (config/), `flowstate schema` and `inspect` all derive from it; a node type is added by
// defining one and registering it (Registry::add in config/registry.h, or a plugin).
//
//   const NodeDef& take_node() {
//     static const NodeDef def = define_node<TakeOptions>(
//         {.type = "take", .phase = Phase::kPerSample,
//          .doc = "keeps the first `count` samples of every epoch"},
//         [](BuildContext& ctx, const TakeOptions& o) {
//           ctx.add(std::make_unique<TakeNode>(ctx.name(), o.count));
//         },
//         inspect_fields<TakeState>);
//     return def;
//   }
#pragma once

#include <any>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"
#include "flowstate/nodes/params.h"

namespace flowstate {

class Pipeline;  // graph/pipeline.h
struct NodeDef;
struct TransformSchema;  // nodes/transform.h
struct PredicateSchema;  // nodes/filter.h

/// Where a node sits in a pipeline. Phases appear in this order; the pipeline has exactly
/// one source (and, through the batch node's Placement, one batch node).
enum class Phase : std::uint8_t {
  kSource,     ///< makes the Refs (records, lines, tar, iterable, mix)
  kSpine,      ///< moves Refs by position, before any map (shard, shuffle)
  kPerSample,  ///< works on samples before batch (map, filter, pack, user nodes like take)
  kBatch,      ///< the batch node
  kPerBatch,   ///< works on batches (batch maps, prefetch, device_copy)
};

/// Where a node may stand beyond its phase (a pipeline has exactly one node of Phase::kBatch,
/// which plans the batches). Declared by the node (NodeInfo::placement, or its
/// options' `placement()`), enforced in one place — Pipeline::Builder — for C++, YAML and
/// Python, with the same messages.
struct Placement {
  bool unique = false;                ///< at most one in a pipeline
  bool last = false;                  ///< the pipeline's last node
  bool directly_after_batch = false;  ///< right after the batch node
  bool in_mix_input = true;           ///< may be part of a mix input
  /// Why, said when the rule is broken ("it cuts each global batch into world slices").
  std::string_view why = {};
};

/// Where a node is being added: what options that depend on it are completed with
/// (NodeDef::resolve; shard after batch is the elastic layout).
struct Position {
  bool after_batch = false;  ///< a node of Phase::kBatch comes before it
};

/// One node of a pipeline description: its unique name, its definition and its options.
struct NodeSpec {
  std::string name;  ///< unique in the pipeline ("shuffle", "map", "map#2")
  const NodeDef* def = nullptr;
  std::shared_ptr<const std::any> options;  ///< of the definition's options type
  NodeDescription description;              ///< def->describe(options)
  std::optional<int> workers;               ///< the node's own worker count (a map's)
  /// Input pipelines (a mix's), instantiated by the node's build through BuildContext.
  std::shared_ptr<const std::vector<Pipeline>> inputs;
  Phase node_phase = Phase::kPerSample;  ///< its phase, with these options
  Placement placement;                   ///< its placement rules, with these options

  Phase phase() const { return node_phase; }
  /// The options as `O`, or null when they are of another type.
  template <class O>
  const O* options_as() const {
    return std::any_cast<O>(options.get());
  }
};

/// Runs body(i) for every i in [0, n), possibly in parallel; returns when all are done. The
/// runtime provides it, so nodes need no threading library.
using ParallelFor = std::function<void(std::size_t n, const std::function<void(std::size_t)>&)>;

/// What a source's build makes: the spine node, which is also the RecordStore.
struct SourceParts {
  std::unique_ptr<SpineNode> node;
  const RecordStore* store = nullptr;  ///< points into `node`
};
/// Creates a source's spine node; `source_id` goes into its Refs.
using SourceFactory = std::function<SourceParts(const std::string& name, std::uint32_t source_id)>;
/// Creates a custom spine node; `key` is the node's random key (seed, position, type).
using SpineFactory =
    std::function<std::unique_ptr<SpineNode>(const std::string& name, std::uint64_t key)>;

/// A complete source made in C++ (from_range, from_producer, or a user's own).
struct SourceSpec {
  NodeDescription description;
  SourceFactory factory;
  /// Collates the source's user values (unset for tensor sources); the batch node uses it
  /// unless its options name another.
  UserCollateFn user_collate;
  /// Said once when the pipeline is built (e.g. "resumes by replaying from the epoch start").
  std::vector<std::string> warnings;

  /// Everything it is described by is in `description`.
  static constexpr auto table() { return std::tuple{}; }
  NodeDescription describe() const { return description; }
  /// The node is named after its type ("iterable").
  std::string base_name() const { return description.type; }
  /// A source needs a factory.
  void validate() const;
};

/// An instantiated stretch of a pipeline: its stateful nodes, and what reads their Refs.
struct Chain {
  std::vector<std::unique_ptr<SpineNode>> nodes;  ///< connected, in order
  std::vector<std::unique_ptr<SampleReader>> readers;
  const RecordStore* store = nullptr;  ///< what the next node reads Refs from
  std::string store_name;
  /// Per-sample maps since `store`, shared with the readers along the chain (MappedReader).
  SharedSampleStages stages = std::make_shared<std::vector<SampleStage>>();
  /// What a node consuming the chain from outside it (a mix) pulls from: nodes.back(), or the
  /// runtime's timing wrapper of it (graph/node_stats.h). Null: nodes.back().
  SpineNode* tail = nullptr;
};

/// What a node's build function adds itself to: one running spine (graph/spine.h implements
/// it). Called once per node each time a Loader starts or restores.
class BuildContext {
 public:
  virtual ~BuildContext() = default;
  /// The node's unique name in the pipeline ("shuffle", "map#2").
  virtual const std::string& name() const = 0;
  /// The node's random key, from the pipeline seed, its position and its type.
  virtual std::uint64_t key() const = 0;
  /// The key of a per-sample or per-batch map's element generator (seed and position).
  virtual std::uint64_t map_key() const = 0;
  /// The source id a source or a store made here puts into its Refs.
  virtual std::uint32_t source_id() const = 0;
  /// The store the upstream's Refs are read from (null for a source).
  virtual const RecordStore* store() const = 0;
  /// Reads the upstream's Refs as they are at this node: the store with the maps since it.
  virtual const SampleReader* reader() = 0;
  /// The runtime's parallel loop.
  virtual const ParallelFor& parallel_for() const = 0;

  /// Appends a stateful node that moves the upstream's Refs.
  virtual void add(std::unique_ptr<SpineNode> node) = 0;
  /// Appends a node whose Refs later nodes read through `store` (a source, pack, mix).
  virtual void add_store(std::unique_ptr<SpineNode> node, const RecordStore* store) = 0;
  /// Adds a per-sample map (before batch).
  virtual void add_sample_map(SampleFn fn) = 0;
  /// Hands the runtime what a node from batch on does (nodes/assembly.h): the batch planner,
  /// a rewrite of every plan, a per-batch map, a deliver stage, the queue depth.
  virtual void add_stage(AssemblyStage stage) = 0;
  /// Adds a per-batch map (after batch): add_stage with only `batch`.
  void add_batch_map(BatchFn fn) {
    AssemblyStage s;
    s.batch = std::move(fn);
    add_stage(std::move(s));
  }
  /// How a source's user values are collated when the batch node names no collate.
  virtual void set_user_collate(UserCollateFn fn) = 0;
  /// True once the batch node has been built (a node after it sees the global batches).
  virtual bool after_batch() const = 0;
  /// Facts a node leaves for the nodes after it in the same chain (shard leaves "rank": a
  /// shuffle after it is keyed by it, so that ranks shuffle independently).
  virtual void set_attribute(const std::string& key, std::uint64_t value) = 0;
  /// A fact an earlier node of this chain left, or nullopt.
  virtual std::optional<std::uint64_t> attribute(const std::string& key) const = 0;
  /// Number of input pipelines of this node (a mix's inputs).
  virtual std::size_t inputs() const = 0;
  /// Instantiates input pipeline `i`; its Refs carry source id `i`.
  virtual Chain build_input(std::size_t i) = 0;
};

/// Reads a node's saved state back as a JSON object (text), for `flowstate inspect`.
struct InspectContext {
  /// The canonical value of one of the node's parameters in the checkpoint ("" if absent).
  std::function<std::string(const std::string& key)> param;
  /// The canonical value of any parameter of the pipeline (or mix input) in the checkpoint,
  /// by its full key ("iterable.resume"); "" if absent.
  std::function<std::string(const std::string& key)> pipeline_param;
  /// Decodes entries nested in the state (a mix input's nodes, see load_entries) to a JSON
  /// list, the same way; `canonical` is that input's description ("{k=v; k=v}").
  std::function<std::string(const std::vector<StampEntry>& entries, const std::string& canonical)>
      nested;
  /// True when the archive holds this node's entry alone (the node API's stamp format), so a
  /// state may end with optional parts; false in a first-format stamp, where the next node's
  /// state follows.
  bool whole_entry = false;
};
using InspectFn = std::function<std::string(InArchive& ar, const InspectContext& ctx)>;

/// What a node's own YAML form asks of the YAML loader reading it (config/yaml.cpp implements
/// it). The registries are the caller's (YamlOptions), also inside a mix's inputs.
class YamlContext {
 public:
  virtual ~YamlContext() = default;
  /// The node's validated parameters: the form's, plus the dispatch value's extra ones.
  virtual const Params& params() const = 0;
  /// The YAML file's directory: relative paths in parameters resolve against it.
  virtual const std::filesystem::path& base_dir() const = 0;
  /// True when a batch node comes before this one.
  virtual bool after_batch() const = 0;
  /// The transform called `name` in the caller's transform registry, or null.
  virtual const TransformSchema* transform(const std::string& name) const = 0;
  /// The names of the caller's transforms, for messages.
  virtual std::vector<std::string> transform_names() const = 0;
  /// The filter predicate called `name` in the caller's registry, or null.
  virtual const PredicateSchema* predicate(const std::string& name) const = 0;
  /// The names of the caller's predicates, for messages.
  virtual std::vector<std::string> predicate_names() const = 0;
  /// Reads `files` as this node's input pipelines (YAML without batch), with the caller's
  /// registries; returns each input's canonical description ("{k=v; k=v}"). The inputs go
  /// with the node that add() adds next.
  virtual std::vector<std::string> read_inputs(const std::vector<std::filesystem::path>& files) = 0;
  /// Adds the node: `def` (the form's own, or another, as map after batch) with `options`.
  virtual void add(const NodeDef& def, std::any options) = 0;
};

/// A node's own YAML form, for a node whose YAML parameters name things its options cannot
/// hold: map's `fn` (a transform), filter's `fn` (a predicate), mix's input files.
struct YamlForm {
  std::string doc;                  ///< one line, when YAML's form says more than the node's
  std::vector<ParamSchema> params;  ///< what YAML takes (the schema shows these)
  /// A parameter whose value picks extra parameters (map: `fn`), or "".
  std::string dispatch;
  /// What a dispatch value names, for messages ("unknown transform 'x'").
  std::string dispatch_what = "transform";
  /// The extra parameters for a dispatch value; null for an unknown value (whose error lists
  /// dispatch_choices). The context's registries answer, before the node is read.
  std::function<const std::vector<ParamSchema>*(const YamlContext&, const std::string& value)>
      extra_params;
  std::function<std::vector<std::string>(const YamlContext&)> dispatch_choices;
  /// Reads the parameters and adds exactly one node through ctx.add. May throw ConfigError
  /// keyed by a parameter.
  std::function<void(YamlContext& ctx)> read;
};

/// A node type's one definition. Definitions live for the whole program (return a static).
struct NodeDef {
  std::string type;  ///< the YAML name and the description's type
  Phase phase = Phase::kPerSample;
  std::string doc;  ///< one line
  std::vector<ParamSchema> params;
  /// YAML parameters to options (held in a std::any of the node's options type).
  std::function<std::any(const Params&, const std::filesystem::path& base_dir)> from_params;
  /// The options type's defaults (`O{}`): what a YAML node gets for every parameter it omits.
  std::function<std::any()> defaults;
  /// Every option's value by key (nullopt: an unset optional), for checks and tools.
  std::function<std::vector<std::pair<std::string, std::optional<ParamValue>>>(const std::any&)>
      values;
  /// The checks of the options table and the options' validate(); throws ConfigError.
  std::function<void(const std::any&, const std::string& node)> validate;
  /// The canonical description (fingerprint, `flowstate validate`).
  std::function<NodeDescription(const std::any&)> describe;
  /// Builds the node into a running spine.
  std::function<void(BuildContext&, const std::any&)> build;
  /// The node's name before "#2" suffixes, when it is not `type` (map: its function's name).
  std::function<std::string(const std::any&)> base_name;
  /// Completes options when the node is added to a pipeline, from where it is added (shard
  /// reads the launcher's rank and world then, and learns it follows batch); null: as given.
  std::function<std::any(const std::any&, const Position&)> resolve;
  /// Where the node may stand (beyond its phase).
  Placement placement;
  /// The node as YAML writes it, for messages about a missing one ("- batch: {size: 256}").
  std::string yaml_example;
  /// The phase and placement with given options, when they depend on them (shard after batch
  /// is a per-batch node right after batch); null: `phase` and `placement`.
  std::function<std::pair<Phase, Placement>(const std::any&)> place;
  /// A check against the whole pipeline, once the order is right (shard after batch: its world
  /// divides the batch size). `nodes[index]` is this node. Throws ConfigError.
  std::function<void(std::span<const NodeSpec> nodes, std::size_t index)> check;
  /// What the node's state keeps of its upstream's output (UpstreamHold): whether a data
  /// change upstream can continue through it.
  UpstreamHold holds_upstream = UpstreamHold::kNothing;
  /// The node divides the data between ranks (shard). A pipeline without one — also in no
  /// input — under a launcher of many ranks gets a warning: every rank reads all the data.
  bool splits_ranks = false;
  /// Checks the options against the rank and world a launcher started (`flowstate run`).
  std::function<void(const std::any&, const std::string& node, std::uint64_t rank,
                     std::uint64_t world)>
      check_launch;
  /// The `param=value` override that makes the node hand out host memory when it would not
  /// (device_copy: `device=cpu`), for runs that must see the bytes (`flowstate run --digests`).
  std::function<std::optional<std::string>(const std::any&)> on_host;
  /// The node's own YAML form; null: YAML reads the options table (from_params).
  std::shared_ptr<const YamlForm> yaml;
  /// The node's own worker count (a map's `workers`); null or nullopt: the pipeline's.
  std::function<std::optional<int>(const std::any&)> workers;
  /// Decodes the node's saved state; null for a node that keeps none.
  InspectFn inspect;
  /// Warnings about the options, said once when the pipeline is built; null: none.
  std::function<std::vector<std::string>(const std::any&)> warnings;
};

/// What define_node needs besides the options and the build function.
struct NodeInfo {
  std::string type;
  Phase phase = Phase::kPerSample;
  std::string doc;
  Placement placement = {};
  bool splits_ranks = false;
  /// The node as YAML writes it, for messages about a missing one ("- batch: {size: 256}").
  std::string yaml_example = {};
  UpstreamHold holds_upstream = UpstreamHold::kNothing;
};

/// A definition whose parameters, YAML reading, checks and description all come from the
/// options table of `O`. `O` may define, each used when present:
///   NodeDescription describe() const        instead of the table's description
///   std::string base_name() const           the node's name before "#2" suffixes
///   O resolved(const Position&) const       completes the options where they are added
///   std::pair<Phase, Placement> placement() const   phase and placement by the options
///   void check(std::span<const NodeSpec>, std::size_t) const   a pipeline-wide check
///   void check_launch(const std::string& node, uint64_t rank, uint64_t world) const
///   std::optional<std::string> on_host() const     the override that delivers host memory
///   std::vector<std::string> warnings() const       said once when the pipeline is built
template <OptionsTable O>
NodeDef define_node(NodeInfo info, std::function<void(BuildContext&, const O&)> build,
                    InspectFn inspect = nullptr) {
  NodeDef d;
  d.type = std::move(info.type);
  d.phase = info.phase;
  d.doc = std::move(info.doc);
  d.params = schema_of<O>();
  d.from_params = [](const Params& p, const std::filesystem::path& base) -> std::any {
    return options_from<O>(p, base);
  };
  d.defaults = [] { return std::any(O{}); };
  d.values = [](const std::any& o) { return values_of(std::any_cast<const O&>(o)); };
  d.validate = [](const std::any& o, const std::string& node) {
    validate_fields(std::any_cast<const O&>(o), node);
  };
  d.describe = [type = d.type](const std::any& a) {
    const O& o = std::any_cast<const O&>(a);
    if constexpr (requires { o.describe(); }) {
      return o.describe();
    } else {
      return NodeDescription{type, describe_fields(o)};
    }
  };
  d.build = [build = std::move(build)](BuildContext& ctx, const std::any& o) {
    build(ctx, std::any_cast<const O&>(o));
  };
  if constexpr (requires(const O& o) { o.base_name(); }) {
    d.base_name = [](const std::any& a) { return std::any_cast<const O&>(a).base_name(); };
  }
  d.placement = info.placement;
  d.yaml_example = std::move(info.yaml_example);
  d.splits_ranks = info.splits_ranks;
  d.holds_upstream = info.holds_upstream;
  if constexpr (requires(const O& o, const Position& p) { O(o.resolved(p)); }) {
    d.resolve = [](const std::any& a, const Position& p) -> std::any {
      return std::any_cast<const O&>(a).resolved(p);
    };
  }
  if constexpr (requires(const O& o) { std::pair<Phase, Placement>(o.placement()); }) {
    d.place = [](const std::any& a) { return std::any_cast<const O&>(a).placement(); };
  }
  if constexpr (requires(const O& o, std::span<const NodeSpec> n) { o.check(n, std::size_t{}); }) {
    d.check = [](std::span<const NodeSpec> nodes, std::size_t i) {
      std::any_cast<const O&>(*nodes[i].options).check(nodes, i);
    };
  }
  if constexpr (requires(const O& o) { o.check_launch(std::string(), 0, 0); }) {
    d.check_launch = [](const std::any& a, const std::string& node, std::uint64_t rank,
                        std::uint64_t world) {
      std::any_cast<const O&>(a).check_launch(node, rank, world);
    };
  }
  if constexpr (requires(const O& o) { std::optional<std::string>(o.on_host()); }) {
    d.on_host = [](const std::any& a) { return std::any_cast<const O&>(a).on_host(); };
  }
  if constexpr (requires(const O& o) { std::optional<int>(o.workers); }) {
    d.workers = [](const std::any& a) -> std::optional<int> {
      return std::any_cast<const O&>(a).workers;
    };
  }
  if constexpr (requires(const O& o) { std::vector<std::string>(o.warnings()); }) {
    d.warnings = [](const std::any& a) { return std::any_cast<const O&>(a).warnings(); };
  }
  d.inspect = std::move(inspect);
  return d;
}

/// The definition of a source made in C++ (options: a SourceSpec). Its stamp entries carry
/// the description's type ("iterable").
const NodeDef& source_node();

/// Builds the text of a JSON object, for InspectFn.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, std::uint64_t v);
  JsonObject& add(const std::string& key, bool v);
  JsonObject& add(const std::string& key, const std::string& v);
  /// `json` is already JSON text (an object, a list, null).
  JsonObject& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return text_ + "}"; }

 private:
  std::string text_ = "{";
};

/// A state struct's inspectable fields: `static constexpr auto inspect_fields()` returning a
/// tuple of (key, member) pairs of unsigned integers and bools.
template <class S>
concept InspectableState = requires {
  S::inspect_fields();
};

/// An InspectFn for a state struct with inspect_fields().
template <InspectableState S>
std::string inspect_fields(InArchive& ar, const InspectContext&) {
  S s;
  ar(s);
  JsonObject j;
  std::apply(
      [&](const auto&... f) {
        (j.add(f.first, static_cast<std::conditional_t<
                            std::is_same_v<std::remove_cvref_t<decltype(s.*(f.second))>, bool>,
                            bool, std::uint64_t>>(s.*(f.second))),
         ...);
      },
      S::inspect_fields());
  return j.str();
}

}  // namespace flowstate
