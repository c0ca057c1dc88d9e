// Pipeline: an immutable description of a dataflow graph — a list of (node name, definition,
// options): a source (records, lines, tar, a C++ range via from_range, a mix of input
// pipelines, or a node of your own), then nodes in phase order (nodes/definition.h: spine,
// per-sample, batch, per-batch) — built with a fluent builder and run by a Loader. The same
// Pipeline can start any number of Loaders. The builder enforces every node's Placement and
// pipeline-wide check (NodeDef); it knows no node type.
//
//   Pipeline p = Pipeline::Builder()
//                    .seed(1234)
//                    .records({.paths = {"data/train-*.bin"}, .record_bytes = 1024})
//                    .shard({})
//                    .shuffle({.mode = ShuffleMode::kBuffer, .size = 16384})
//                    .add(take_node(), TakeOptions{.count = 5000})   // any node, also a user's
//                    .batch({.size = 256})
//                    .prefetch({.depth = 4})
//                    .build();
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate {

class Pipeline;

// The built-in nodes' options and definitions, for the Builder's shorthands below. Their
// headers (nodes/*.h, or all of them: <flowstate/nodes/builtin.h>) complete them where a
// shorthand is used; the runtime itself knows no node type.
struct RecordsOptions;
struct LinesOptions;
struct TarOptions;
struct ShardOptions;
struct ShuffleOptions;
struct MixOptions;
struct MapOptions;
struct FilterOptions;
struct PackOptions;
struct PrefetchOptions;
struct DeviceCopyOptions;
const NodeDef& records_node();
const NodeDef& lines_node();
const NodeDef& tar_node();
const NodeDef& shard_node();
const NodeDef& shuffle_node();
const NodeDef& mix_node();
const NodeDef& map_node();
const NodeDef& batch_map_node();
const NodeDef& filter_node();
const NodeDef& pack_node();
const NodeDef& batch_node();
const NodeDef& prefetch_node();
const NodeDef& device_copy_node();

/// How placement errors word what they name, for a front end that names nodes its own way
/// (YAML: "nodes[2]").
struct PlacementWords {
  /// How a message refers to node `i`; null: by its name in quotes ("'batch'").
  std::function<std::string(std::size_t i)> node;
  /// The message when the pipeline has no batch node; null: "a pipeline needs exactly one
  /// batch node".
  std::function<std::string()> missing_batch;
  bool mix_input = false;  ///< set by build_input
};

/// True for a `workers` setting as an int: a count >= 1, static_cast<int>(kAuto) (0) or
/// static_cast<int>(kInline) (-1). Pipeline::Builder::workers, LoaderOptions' users (bench,
/// verify) check their settings with it.
inline bool is_workers_setting(int workers) {
  return workers >= 1 || workers == static_cast<int>(kAuto) || workers == static_cast<int>(kInline);
}

/// An immutable, validated pipeline description.
class Pipeline {
 public:
  class Builder;

  std::uint64_t seed() const { return seed_; }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  /// Default number of parallel batch-assembly workers (a map's `workers` overrides it), or
  /// kAuto (0): the Loader picks and adjusts it (graph/autotune.h), or kInline (-1): batches
  /// are made on the consumer's thread, in next().
  int workers() const { return workers_; }
  /// The pipeline without its free parameters, as "node.param" -> value pairs.
  std::vector<CanonicalParam> canonical() const;
  /// Warnings the pipeline's nodes raised when it was built (also written to stderr once).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// Throws ConfigError when a node does not fit the rank and world a launcher started (a
  /// shard resolved for another rank); mix inputs included.
  void check_launch(std::uint64_t rank, std::uint64_t world) const;
  /// The `--set` overrides ("nodes[i].type.param=value") that make the pipeline hand out host
  /// memory (NodeDef::on_host); empty when it does already.
  std::vector<std::string> host_overrides() const;
  /// True when a node divides the data between ranks (NodeDef::splits_ranks), here or in an
  /// input.
  bool splits_ranks() const;
  /// The data parameters (DescribedParam::data) as "node.key", a list's elements ("inputs[0]")
  /// under the list's key ("inputs").
  std::vector<std::string> data_params() const;
  /// Hash of canonical(): what must match between a checkpoint and the pipeline restoring it.
  std::uint64_t fingerprint() const { return fingerprint_of(canonical()); }
  /// One line per node with every parameter (free ones marked), for `flowstate validate`.
  std::string describe() const;

 private:
  std::uint64_t seed_ = 0;
  int workers_ = 2;
  std::vector<NodeSpec> nodes_;
  std::vector<std::string> warnings_;
};

/// Builds a Pipeline. Nodes are added in data-flow order; build() checks the order. Every
/// add validates the node's options (the same checks YAML runs) and throws ConfigError keyed
/// "<node>.<option>".
class Pipeline::Builder {
 public:
  /// The pipeline seed: shuffles and map generators derive from it.
  Builder& seed(std::uint64_t seed);
  /// Default parallel workers for reading, mapping and collating batches (>= 1), or kAuto:
  /// tuned while running (graph/autotune.h), or static_cast<int>(kInline): no thread, each
  /// batch is planned and made on the consumer's thread when it asks (like torch's
  /// num_workers=0; no read-ahead, and no hand-off between threads). Free.
  Builder& workers(int workers);

  /// Adds any node: its definition and options of the definition's type. `inputs` are the
  /// node's input pipelines (a mix's). The open node API: a user's own node goes in here.
  Builder& add(const NodeDef& def, std::any options, std::vector<Pipeline> inputs = {});

  /// Any source: `description` names its type and parameters for the fingerprint.
  Builder& source(NodeDescription description, SourceFactory factory);
  /// A source with its collate and warnings (see from_range()).
  Builder& source(SourceSpec spec);

  // Shorthands for the built-in nodes: add(X_node(), options). Each is a template whose
  // options type defaults to the node's, so `.shard({})` and `.batch({.size = 256})` read as
  // before; the node's header must be included where one is used.

  /// The `records` source.
  template <class O = RecordsOptions>
  Builder& records(O options) {
    return add(records_node(), std::move(options));
  }
  /// The `lines` source (text and JSON Lines).
  template <class O = LinesOptions>
  Builder& lines(O options) {
    return add(lines_node(), std::move(options));
  }
  /// The `tar` source (WebDataset-style shards).
  template <class O = TarOptions>
  Builder& tar(O options) {
    return add(tar_node(), std::move(options));
  }
  template <class O = ShardOptions>
  Builder& shard(O options = {}) {
    return add(shard_node(), std::move(options));
  }
  template <class O = ShuffleOptions>
  Builder& shuffle(O options = {}) {
    return add(shuffle_node(), std::move(options));
  }
  /// A source that samples from several input pipelines (built with build_input()).
  template <class O = MixOptions>
  Builder& mix(std::vector<Pipeline> inputs, O options) {
    options.inputs = describe_inputs(inputs);
    return add(mix_node(), std::move(options), std::move(inputs));
  }
  /// A per-sample map (before batch).
  template <class O = MapOptions>
  Builder& map(SampleFn fn, O options = {}) {
    options.fn = std::move(fn);
    options.batch_fn = nullptr;
    return add(map_node(), std::move(options));
  }
  /// Drops the samples `fn` rejects (before batch; may follow maps).
  template <class O = FilterOptions>
  Builder& filter(FilterFn fn, O options = {}) {
    options.fn = std::move(fn);
    return add(filter_node(), std::move(options));
  }
  /// Packs token sequences into fixed-length rows (before batch; may follow maps and filters).
  template <class O = PackOptions>
  Builder& pack(O options) {
    return add(pack_node(), std::move(options));
  }
  /// A per-batch map (after batch).
  template <class O = MapOptions>
  Builder& map_batch(BatchFn fn, O options = {}) {
    options.batch_fn = std::move(fn);
    options.fn = nullptr;
    return add(batch_map_node(), std::move(options));
  }
  template <class O = BatchOptions>
  Builder& batch(O options) {
    return add(batch_node(), std::move(options));
  }
  template <class O = PrefetchOptions>
  Builder& prefetch(O options) {
    return add(prefetch_node(), std::move(options));
  }
  template <class O = DeviceCopyOptions>
  Builder& device_copy(O options = {}) {
    return add(device_copy_node(), std::move(options));
  }

  /// The nodes added so far, in order.
  const std::vector<NodeSpec>& nodes() const { return p_.nodes_; }
  /// Validates and returns the pipeline: the phase order, every node's Placement and its
  /// pipeline-wide check (NodeDef). Throws ConfigError keyed by the offending node's name.
  Pipeline build(const PlacementWords& words = {}) const;
  /// Validates and returns an input of a mix: a source followed by nodes whose Placement
  /// allows a mix input (shard, shuffle, filter, per-sample maps; no batch, pack or mix).
  Pipeline build_input(const PlacementWords& words = {}) const;

  /// Each input's canonical description, "{k=v; k=v}" (what a mix's `inputs` records).
  static std::vector<std::string> describe_inputs(const std::vector<Pipeline>& inputs);

 private:
  /// Checks the order of the nodes (shared by build and build_input).
  void check_order() const;
  /// Checks every node's Placement (and that there is one batch node).
  void check_placement(const PlacementWords& words) const;
  /// Runs the nodes' pipeline-wide checks (NodeDef::check), once the order is right.
  void run_checks() const;
  /// `base` made unique with a "#k" suffix; linear in the number of nodes overall.
  std::string unique_name(const std::string& base);
  Pipeline p_;
  std::set<std::string> taken_;
  std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace flowstate
