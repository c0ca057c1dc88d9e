// `map`: a stateless transform, per sample (before `batch`) or per batch (after it). It runs
// on the parallel workers; output order is preserved by the graph. Randomness comes from the
// MapContext's generator, keyed by (pipeline seed, node, epoch, record), so results do not
// depend on the number of workers or on timing.
//
//   builder.map([](Sample& s, MapContext& ctx) { ... }, {.name = "augment", .workers = 2});
#pragma once

#include <optional>
#include <string>

#include "nodes/batch.h"
#include "nodes/node.h"

namespace flowstate {

/// Options of the `map` node.
struct MapOptions {
  /// Names the transform in errors and in the fingerprint: a C++ callable cannot be hashed, so
  /// give two different functions different names.
  std::string name = "map";
  /// Parallel workers for the batch-assembly stage; unset: the pipeline's default. Free:
  /// changing it never changes the output.
  std::optional<int> workers;
  /// Extra canonical parameters (set by named transforms, e.g. from YAML).
  std::vector<DescribedParam> params;
  NodeDescription describe() const;
};

/// Options of the `prefetch` node: how many batches may be prepared ahead of the consumer.
struct PrefetchOptions {
  std::size_t depth = 4;  ///< >= 1; free
  NodeDescription describe() const;
};

}  // namespace flowstate
