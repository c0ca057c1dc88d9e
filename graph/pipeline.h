// Pipeline: an immutable description of a dataflow graph — a source (records, lines, tar, a
// C++ range via from_range, or a mix of input pipelines), then spine nodes (shard, shuffle),
// sample maps, filters and pack, `batch`, batch maps, `prefetch` and `device_copy` — built
// with a fluent builder and run by a Loader. The same Pipeline can start any number of
// Loaders.
//
//   Pipeline p = Pipeline::Builder()
//                    .seed(1234)
//                    .records({.paths = {"data/train-*.bin"}, .record_bytes = 1024})
//                    .shard({})
//                    .shuffle({.mode = ShuffleMode::kBuffer, .size = 16384})
//                    .batch({.size = 256})
//                    .prefetch({.depth = 4})
//                    .build();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nodes/batch.h"
#include "nodes/device_copy.h"
#include "nodes/filter.h"
#include "nodes/map.h"
#include "nodes/mix.h"
#include "nodes/node.h"
#include "nodes/pack.h"
#include "nodes/shard.h"
#include "nodes/shuffle.h"
#include "nodes/sources/lines.h"
#include "nodes/sources/records.h"
#include "nodes/sources/tar.h"
#include "serialization/pipeline_state.h"

namespace flowstate {

/// What a source factory returns: the spine node, which is also the RecordStore.
struct SourceParts {
  std::unique_ptr<SpineNode> node;
  const RecordStore* store = nullptr;  ///< points into `node`
};
/// Creates a source's spine node; `source_id` goes into its Refs.
using SourceFactory = std::function<SourceParts(const std::string& name, std::uint32_t source_id)>;
/// The factory of a source class constructed as Source(name, options, source_id) that is
/// also its RecordStore (records, lines, tar).
template <class Source, class Options>
SourceFactory source_factory(Options options) {
  return [options = std::move(options)](const std::string& name, std::uint32_t source_id) {
    auto node = std::make_unique<Source>(name, options, source_id);
    const RecordStore* store = node.get();
    return SourceParts{std::move(node), store};
  };
}

/// A complete source description, as from_range() returns it.
struct SourceSpec {
  NodeDescription description;
  SourceFactory factory;
  /// Collates the source's user values (unset for tensor sources); the batch node uses it
  /// unless its options name another.
  UserCollateFn user_collate;
  /// Said once when the pipeline is built (e.g. "resumes by replaying from the epoch start").
  std::vector<std::string> warnings;
};
/// Creates a spine node; `key` is the node's random key (seed, position, options).
using SpineFactory =
    std::function<std::unique_ptr<SpineNode>(const std::string& name, std::uint64_t key)>;

class Pipeline;

/// One node of a pipeline description.
struct NodeSpec {
  enum class Kind : std::uint8_t {
    kSource,
    kMix,  ///< a source made of other pipelines
    kSpine,
    kSampleMap,
    kFilter,
    kPack,
    kBatch,
    kBatchMap,
    kPrefetch,
    kDeviceCopy
  };
  Kind kind;
  std::string name;  ///< unique in the pipeline ("shuffle", "map", "map#2")
  NodeDescription description;
  SourceFactory make_source;
  UserCollateFn user_collate;  ///< kSource: the source's collate for user values
  SpineFactory make_spine;
  SampleFn sample_fn;
  BatchFn batch_fn;
  FilterFn filter_fn;
  PackOptions pack;
  MixOptions mix;
  std::shared_ptr<const std::vector<Pipeline>> mix_inputs;
  std::optional<int> workers;
  BatchOptions batch;
  PrefetchOptions prefetch;
  DeviceCopyOptions device;
};

/// An immutable, validated pipeline description.
class Pipeline {
 public:
  class Builder;

  std::uint64_t seed() const { return seed_; }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  /// Default number of parallel batch-assembly workers (a map's `workers` overrides it).
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

/// Builds a Pipeline. Nodes are added in data-flow order; build() checks the order.
class Pipeline::Builder {
 public:
  /// The pipeline seed: shuffles and map generators derive from it.
  Builder& seed(std::uint64_t seed);
  /// Default parallel workers for reading, mapping and collating batches (>= 1). Free.
  Builder& workers(int workers);
  /// The `records` source.
  Builder& records(RecordsOptions options);
  /// The `lines` source (text and JSON Lines).
  Builder& lines(LinesOptions options);
  /// The `tar` source (WebDataset-style shards).
  Builder& tar(TarOptions options);
  /// Any source: `description` names its type and parameters for the fingerprint.
  Builder& source(NodeDescription description, SourceFactory factory);
  /// A source with its collate and warnings (see from_range()).
  Builder& source(SourceSpec spec);
  Builder& shard(ShardOptions options = {});
  Builder& shuffle(ShuffleOptions options = {});
  /// A custom spine node.
  Builder& spine(NodeDescription description, SpineFactory factory);
  /// A source that samples from several input pipelines (built with build_input()).
  Builder& mix(std::vector<Pipeline> inputs, MixOptions options);
  /// A per-sample map (before batch).
  Builder& map(SampleFn fn, MapOptions options = {});
  /// Drops the samples `fn` rejects (before batch; may follow maps).
  Builder& filter(FilterFn fn, FilterOptions options = {});
  /// Packs token sequences into fixed-length rows (before batch; may follow maps and filters).
  Builder& pack(PackOptions options);
  /// A per-batch map (after batch).
  Builder& map_batch(BatchFn fn, MapOptions options = {});
  Builder& batch(BatchOptions options);
  Builder& prefetch(PrefetchOptions options);
  Builder& device_copy(DeviceCopyOptions options = {});
  /// Validates and returns the pipeline. Throws ConfigError naming the offending node.
  Pipeline build() const;
  /// Validates and returns an input of a mix: a source followed by shard, shuffle, filter and
  /// per-sample maps only (no batch, pack or mix).
  Pipeline build_input() const;

 private:
  /// Checks the order of the nodes (shared by build and build_input).
  void check_order() const;
  /// Appends a node named `base` (default: its type), made unique with a "#k" suffix.
  NodeSpec& add(NodeSpec::Kind kind, NodeDescription description, std::string base = {});
  Pipeline p_;
};

}  // namespace flowstate
