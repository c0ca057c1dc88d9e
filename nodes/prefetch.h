// `prefetch`: how many batches may be prepared ahead of the consumer. Free: it never changes
// the batches, only how far the graph runs ahead (and the memory that takes).
#pragma once

#include <cstddef>

#include "flowstate/nodes/definition.h"

namespace flowstate {

/// Options of the `prefetch` node.
struct PrefetchOptions {
  std::size_t depth = 4;  ///< >= 1; free

  static constexpr auto table() {
    return std::tuple{
        param("depth", &PrefetchOptions::depth,
              {.min = 1, .max = 4096, .free = true, .doc = "batches prepared ahead"})};
  }
};

/// The `prefetch` node's definition.
const NodeDef& prefetch_node();

}  // namespace flowstate
