// `filter`: drops the samples a predicate rejects. It runs in the spine, before batches are
// planned, so every batch still holds exactly `size` samples and a checkpoint position is
// exact however many samples were dropped — also when a whole batch's worth is. It pulls
// from its upstream exactly what it needs, never ahead, so it carries no pending samples:
// its state is the epoch and a count of dropped samples.
//
// The predicate sees the sample as the pipeline has it at the filter's position (the
// record with every earlier per-sample map applied), evaluated in parallel over the chunk it
// pulls. Its generator is keyed like a map's, so a random predicate is reproducible. A
// predicate on a field's length alone (`by_length`, YAML's `fn: length`) is decided from the
// store's view of the record (RecordView, from an index) without reading it, where no map
// comes before the filter and the store has one.
//
//   builder.filter([](const Sample& s, MapContext&) { return s.at("len").values<int64_t>()[0] > 8;
//   },
//                  {.name = "long_enough"});
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

/// Keeps a sample when it returns true. Must be thread-safe and deterministic in (sample,
/// generator).
using FilterFn = std::function<bool(const Sample&, MapContext&)>;

/// A predicate that keeps a sample when the first dimension of its 1-D field `field` lies in
/// [min, max]: the filter may decide it from RecordStore::view, without reading the record.
struct LengthRule {
  FieldId field = 0;
  double min = 0, max = 0;
};

/// Options of the `filter` node.
struct FilterOptions {
  /// Names the predicate in errors and in the fingerprint (a C++ callable cannot be hashed).
  std::string name = "filter";
  /// Extra canonical parameters (set by named predicates, e.g. from YAML).
  std::vector<DescribedParam> params;
  /// The predicate (the builder's filter(fn, options) sets it).
  FilterFn fn;
  /// Set when `fn` is exactly this length rule (it must agree with `fn`, which still decides
  /// records the store cannot view).
  std::optional<LengthRule> by_length;

  static constexpr auto table() {
    return std::tuple{param("fn", &FilterOptions::name,
                            {.doc = "names the predicate in errors and in the fingerprint"})};
  }
  /// A filter needs a predicate.
  void validate() const;
  /// "filter(fn=NAME, ...)".
  NodeDescription describe() const;
  /// The node is named after its predicate.
  std::string base_name() const { return name; }
};

/// The `filter` node's definition.
const NodeDef& filter_node();

/// State of a filter: nothing it holds, only what it has seen.
struct FilterState {
  std::uint64_t epoch = 0;
  std::uint64_t dropped = 0;  ///< samples dropped so far in the epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("FilterState", version, 1);
    ar(epoch, dropped);
  }
  static constexpr auto inspect_fields() {
    return std::tuple{std::pair{"epoch", &FilterState::epoch},
                      std::pair{"dropped", &FilterState::dropped}};
  }
};

/// The `filter` spine node.
class FilterNode final : public StatefulSpineNode<FilterState> {
 public:
  /// `reader` reads a Ref as the predicate sees it; `store` gets the dropped Refs back;
  /// `key` keys the predicate's generator; `parallel` evaluates a chunk's predicates.
  FilterNode(std::string name, FilterFn fn, std::uint64_t key, const SampleReader* reader,
             const RecordStore* store, ParallelFor parallel,
             std::optional<LengthRule> by_length = std::nullopt);

  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 private:
  FilterFn fn_;
  ParallelFor parallel_;
  std::uint64_t key_;
  const SampleReader* reader_;
  const RecordStore* store_;
  std::optional<LengthRule> by_length_;  ///< only where the reader has no maps
  std::vector<Ref> chunk_;
  std::vector<Ref> dropped_;
  std::vector<char> keep_;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::FilterState, 1);
