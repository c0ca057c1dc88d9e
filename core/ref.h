// Ref: the 16-byte address of one record. The stateful spine of a pipeline moves Refs, never
// record bytes; the parallel stages turn Refs into samples.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

namespace flowstate {

/// The address of one record: which source, which shard (file) of it, and the record's
/// global index within the source (file k's records follow file k-1's).
struct Ref {
  std::uint32_t source = 0;  ///< source id within the pipeline
  std::uint32_t shard = 0;   ///< file (or shard) index within the source
  std::uint64_t index = 0;   ///< global record index within the source

  auto operator<=>(const Ref&) const = default;
  /// "source:index", the form used in provenance files.
  std::string to_string() const { return std::to_string(source) + ":" + std::to_string(index); }

  template <class Archive>
  void serialize(Archive& ar) {
    ar(source, shard, index);
  }
};
static_assert(sizeof(Ref) == 16);

}  // namespace flowstate
