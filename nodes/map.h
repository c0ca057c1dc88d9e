// `map`: a stateless transform, per sample (before `batch`) or per batch (after it). It runs
// on the parallel workers; output order is preserved by the graph. Randomness comes from the
// MapContext's generator, keyed by (pipeline seed, node, epoch, record), so results do not
// depend on the number of workers or on timing.
//
//   builder.map([](Sample& s, MapContext& ctx) { ... }, {.name = "augment", .workers = 2});
#pragma once

#include <optional>
#include <string>

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"

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
  /// The function: per sample (before batch) or per batch (after it); the builder's map()
  /// and map_batch() set one.
  SampleFn fn;
  BatchFn batch_fn;

  static constexpr auto table() {
    using O = MapOptions;
    return std::tuple{
        param("fn", &O::name, {.doc = "names the transform in errors and in the fingerprint"}),
        param("workers", &O::workers,
              {.min = 1,
               .max = 1024,
               .free = true,
               .doc = "parallel workers assembling batches",
               .default_doc = "the pipeline's workers"}),
    };
  }
  /// A map needs its function.
  void validate() const;
  /// "map(fn=NAME, <params>, workers=N)".
  NodeDescription describe() const;
  /// The node is named after its function.
  std::string base_name() const { return name; }
};

/// The per-sample `map` node's definition (before batch).
const NodeDef& map_node();
/// The per-batch `map` node's definition (after batch).
const NodeDef& batch_map_node();

}  // namespace flowstate
