// Pipeline: an immutable description of a dataflow graph — a source, then spine nodes
// (shard, shuffle), sample maps, `batch`, batch maps, `prefetch` and `device_copy` — built with
// a fluent builder and run by a Loader. The same Pipeline can start any number of Loaders.
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
#include "nodes/map.h"
#include "nodes/node.h"
#include "nodes/shard.h"
#include "nodes/shuffle.h"
#include "nodes/sources/records.h"
#include "serialization/pipeline_state.h"

namespace flowstate {

/// What a source factory returns: the spine node, which is also the RecordStore.
struct SourceParts {
  std::unique_ptr<SpineNode> node;
  const RecordStore* store = nullptr;  ///< points into `node`
};
/// Creates a source's spine node; `source_id` goes into its Refs.
using SourceFactory = std::function<SourceParts(const std::string& name, std::uint32_t source_id)>;
/// Creates a spine node; `key` is the node's random key (seed, position, options).
using SpineFactory =
    std::function<std::unique_ptr<SpineNode>(const std::string& name, std::uint64_t key)>;

/// One node of a pipeline description.
struct NodeSpec {
  enum class Kind : std::uint8_t {
    kSource,
    kSpine,
    kSampleMap,
    kBatch,
    kBatchMap,
    kPrefetch,
    kDeviceCopy
  };
  Kind kind;
  std::string name;  ///< unique in the pipeline ("shuffle", "map", "map#2")
  NodeDescription description;
  SourceFactory make_source;
  SpineFactory make_spine;
  SampleFn sample_fn;
  BatchFn batch_fn;
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
  /// Hash of canonical(): what must match between a checkpoint and the pipeline restoring it.
  std::uint64_t fingerprint() const { return fingerprint_of(canonical()); }
  /// One line per node with every parameter (free ones marked), for `flowstate validate`.
  std::string describe() const;

 private:
  std::uint64_t seed_ = 0;
  int workers_ = 2;
  std::vector<NodeSpec> nodes_;
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
  /// Any source: `description` names its type and parameters for the fingerprint.
  Builder& source(NodeDescription description, SourceFactory factory);
  Builder& shard(ShardOptions options = {});
  Builder& shuffle(ShuffleOptions options = {});
  /// A custom spine node.
  Builder& spine(NodeDescription description, SpineFactory factory);
  /// A per-sample map (before batch).
  Builder& map(SampleFn fn, MapOptions options = {});
  /// A per-batch map (after batch).
  Builder& map_batch(BatchFn fn, MapOptions options = {});
  Builder& batch(BatchOptions options);
  Builder& prefetch(PrefetchOptions options);
  Builder& device_copy(DeviceCopyOptions options = {});
  /// Validates and returns the pipeline. Throws ConfigError naming the offending node.
  Pipeline build() const;

 private:
  /// Appends a node named `base` (default: its type), made unique with a "#k" suffix.
  NodeSpec& add(NodeSpec::Kind kind, NodeDescription description, std::string base = {});
  Pipeline p_;
};

}  // namespace flowstate
