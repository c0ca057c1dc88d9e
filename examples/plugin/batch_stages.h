// Two nodes after `batch`, written as a user writes them — the kinds the runtime used to know
// by type, now plugins like any other (nodes/assembly.h: AssemblyStage):
//
//   slice     a stage in the spine, like shard after batch: keeps the first `count` samples
//             of every planned batch (the rest are never read). It rewrites each plan before
//             the batch is stamped, so a resume plans the same slices.
//   checksum  a batch-time stage, like device_copy: runs on every batch serially, in step
//             order, as it is handed out, and adds a uint64 field `field` (default "checksum")
//             holding the batch's digest (Batch::digest: names, dtypes, shapes and bytes of
//             its fields), for a consumer to compare with what it received.
//
// Neither keeps state: what they do is a function of the batch, so every checkpoint of the
// pipeline holds exactly the state of the nodes before them. YAML: `- slice: {count: 8}`,
// `- checksum: {}`; C++: `.add(slice_node(), SliceOptions{.count = 8})`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/options.h"

namespace flowstate::examples {

/// Options of the `slice` node.
struct SliceOptions {
  std::uint64_t count = 0;  ///< samples kept at the start of every batch

  static constexpr auto table() {
    return std::tuple{
        param("count", &SliceOptions::count,
              {.min = 1, .required = true, .doc = "samples kept at the start of every batch"})};
  }
  /// Right after batch: it decides which samples a batch reads.
  std::pair<Phase, Placement> placement() const;
  /// `count` is at most the batch node's size.
  void check(std::span<const NodeSpec> nodes, std::size_t index) const;
};

/// The `slice` node's definition.
const NodeDef& slice_node();

/// Options of the `checksum` node.
struct ChecksumOptions {
  std::string field = "checksum";  ///< the uint64 [1] field added to every batch

  static constexpr auto table() {
    return std::tuple{param("field", &ChecksumOptions::field,
                            {.doc = "the uint64 [1] field that gets the batch's digest"})};
  }
};

/// The `checksum` node's definition.
const NodeDef& checksum_node();

}  // namespace flowstate::examples
