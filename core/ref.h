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

  /// Set in `index` on a padding sample: a record repeated so that every rank takes the same
  /// number of steps (shard's `uneven: pad`). Record indices stay far below it.
  static constexpr std::uint64_t kPadBit = std::uint64_t{1} << 63;

  /// `shard` of a gone position (Ref::gone): in an epoch that continues over files removed
  /// mid-epoch, a position of a removed file's record (SpineNode::positions). Never a record.
  static constexpr std::uint32_t kGoneShard = ~std::uint32_t{0};

  auto operator<=>(const Ref&) const = default;
  /// The gone position of source `source`: a skip marker, not data (see kGoneShard). The nodes
  /// that address their upstream by position (shuffle, shard) skip it; pull never returns it.
  static Ref gone(std::uint32_t source) { return {source, kGoneShard, 0}; }
  /// True for a gone position (see gone()).
  bool is_gone() const { return shard == kGoneShard; }
  /// True when this sample repeats a record as padding (see kPadBit).
  bool is_pad() const { return (index & kPadBit) != 0; }
  /// The record this Ref reads: itself without the padding mark.
  Ref record() const { return {source, shard, index & ~kPadBit}; }
  /// The same record marked as padding.
  Ref as_pad() const { return {source, shard, index | kPadBit}; }
  /// "source:index", the form used in provenance files; "source:index:pad" for padding.
  std::string to_string() const {
    return std::to_string(source) + ":" + std::to_string(index & ~kPadBit) +
           (is_pad() ? ":pad" : "");
  }

  template <class Archive>
  void serialize(Archive& ar) {
    ar(source, shard, index);
  }
};
static_assert(sizeof(Ref) == 16);

}  // namespace flowstate
