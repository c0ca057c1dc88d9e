// Pipeline: an immutable description of a dataflow graph — a list of (node name, definition,
// options): a source (records, lines, tar, a C++ range via from_range, a mix of input
// pipelines, or a node of your own), then nodes in phase order (nodes/definition.h: spine,
// per-sample, batch, per-batch) — built with a fluent builder and run by a Loader. The same
// Pipeline can start any number of Loaders.
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

#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/filter.h"
#include "flowstate/nodes/map.h"
#include "flowstate/nodes/mix.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/pack.h"
#include "flowstate/nodes/prefetch.h"
#include "flowstate/nodes/shard.h"
#include "flowstate/nodes/shuffle.h"
#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/sources/records.h"
#include "flowstate/nodes/sources/tar.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate {

class Pipeline;

/// One node of a pipeline description: its unique name, its definition and its options.
struct NodeSpec {
  std::string name;  ///< unique in the pipeline ("shuffle", "map", "map#2")
  const NodeDef* def = nullptr;
  std::shared_ptr<const std::any> options;  ///< of the definition's options type
  NodeDescription description;              ///< def->describe(options)
  std::optional<int> workers;               ///< the node's own worker count (a map's)
  /// Input pipelines (a mix's), instantiated by the node's build through BuildContext.
  std::shared_ptr<const std::vector<Pipeline>> inputs;

  Phase phase() const { return def->phase; }
  /// The options as `O`, or null when they are of another type.
  template <class O>
  const O* options_as() const {
    return std::any_cast<O>(options.get());
  }
};

/// An immutable, validated pipeline description.
class Pipeline {
 public:
  class Builder;

  std::uint64_t seed() const { return seed_; }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  /// Default number of parallel batch-assembly workers (a map's `workers` overrides it), or
  /// kAuto (0): the Loader picks and adjusts it (graph/autotune.h).
  int workers() const { return workers_; }
  /// The pipeline without its free parameters, as "node.param" -> value pairs.
  std::vector<CanonicalParam> canonical() const;
  /// Warnings the pipeline's nodes raised when it was built (also written to stderr once).
  const std::vector<std::string>& warnings() const { return warnings_; }
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
  /// tuned while running (graph/autotune.h). Free.
  Builder& workers(int workers);

  /// Adds any node: its definition and options of the definition's type. `inputs` are the
  /// node's input pipelines (a mix's). The open node API: a user's own node goes in here.
  Builder& add(const NodeDef& def, std::any options, std::vector<Pipeline> inputs = {});

  /// The `records` source.
  Builder& records(RecordsOptions options) { return add(records_node(), std::move(options)); }
  /// The `lines` source (text and JSON Lines).
  Builder& lines(LinesOptions options) { return add(lines_node(), std::move(options)); }
  /// The `tar` source (WebDataset-style shards).
  Builder& tar(TarOptions options) { return add(tar_node(), std::move(options)); }
  /// Any source: `description` names its type and parameters for the fingerprint.
  Builder& source(NodeDescription description, SourceFactory factory);
  /// A source with its collate and warnings (see from_range()).
  Builder& source(SourceSpec spec);
  Builder& shard(ShardOptions options = {}) { return add(shard_node(), options); }
  Builder& shuffle(ShuffleOptions options = {}) { return add(shuffle_node(), options); }
  /// A source that samples from several input pipelines (built with build_input()).
  Builder& mix(std::vector<Pipeline> inputs, MixOptions options);
  /// A per-sample map (before batch).
  Builder& map(SampleFn fn, MapOptions options = {});
  /// Drops the samples `fn` rejects (before batch; may follow maps).
  Builder& filter(FilterFn fn, FilterOptions options = {});
  /// Packs token sequences into fixed-length rows (before batch; may follow maps and filters).
  Builder& pack(PackOptions options) { return add(pack_node(), std::move(options)); }
  /// A per-batch map (after batch).
  Builder& map_batch(BatchFn fn, MapOptions options = {});
  Builder& batch(BatchOptions options) { return add(batch_node(), std::move(options)); }
  Builder& prefetch(PrefetchOptions options) { return add(prefetch_node(), options); }
  Builder& device_copy(DeviceCopyOptions options = {}) {
    return add(device_copy_node(), std::move(options));
  }
  /// The nodes added so far, in order.
  const std::vector<NodeSpec>& nodes() const { return p_.nodes_; }
  /// Validates and returns the pipeline. Throws ConfigError naming the offending node.
  Pipeline build() const;
  /// Validates and returns an input of a mix: a source followed by shard, shuffle, filter,
  /// per-sample maps and other per-sample nodes that keep their input's Refs (no batch, pack
  /// or mix).
  Pipeline build_input() const;

 private:
  /// Checks the order of the nodes (shared by build and build_input).
  void check_order() const;
  /// `base` made unique with a "#k" suffix; linear in the number of nodes overall.
  std::string unique_name(const std::string& base);
  Pipeline p_;
  std::set<std::string> taken_;
  std::unordered_map<std::string, int> next_suffix_;
};

}  // namespace flowstate
