// `prefetch`: how many batches may be prepared ahead of the consumer. Free: it never changes
// the batches, only how far the graph runs ahead (and the memory that takes).
#pragma once

#include <cstddef>

#include "flowstate/nodes/definition.h"

namespace flowstate {

/// Options of the `prefetch` node.
struct PrefetchOptions {
  /// >= 1, or kAuto: tuned while running within LoaderOptions::memory_budget
  /// (graph/autotune.h). Free.
  std::size_t depth = 4;

  static constexpr auto table() {
    return std::tuple{param("depth", &PrefetchOptions::depth,
                            {.min = 1,
                             .max = 4096,
                             .free = true,
                             .auto_value = true,
                             .doc = "batches prepared ahead; auto: tuned while running",
                             .text = [](const PrefetchOptions& o) {
                               return o.depth == kAuto ? std::string("auto")
                                                       : std::to_string(o.depth);
                             }})};
  }
};

/// The `prefetch` node's definition.
const NodeDef& prefetch_node();

}  // namespace flowstate
