// `filter`: drops the samples a predicate rejects. It runs in the spine, before batches are
// planned, so every batch still holds exactly `size` samples and a checkpoint position is
// exact however many samples were dropped — also when a whole batch's worth is. It pulls
// from its upstream exactly what it needs, never ahead, so it carries no pending samples:
// its state is the epoch, a count of dropped samples and its position in the upstream.
//
// The predicate sees the sample as the pipeline has it at the filter's position (the
// record with every earlier per-sample map applied), evaluated in parallel. Where the
// upstream gives random access (a source, shard, global shuffle), the filter decides ahead of
// what it pulls: a window of the upstream's next Refs (`at(epoch, consumed + k)`, 16 at first,
// doubling to 256) is read and decided at once on the pipeline's workers, and each Ref then
// pulled takes its decision from the window after a check that it is the same Ref; the window
// is never part of the state, and an error is thrown when the filter reaches its Ref. So a
// filter in front of pack — which pulls one document at a time — still reads in parallel, and
// tells pack (`upcoming`) which documents it will pass on, so that pack reads them ahead too.
// Otherwise it evaluates the chunk it pulls in parallel. Its generator is keyed like a map's, so a
// random predicate is reproducible. A predicate on a field's length alone (`by_length`, YAML's `fn:
// length`) is decided from the store's view of the record (RecordView, from an index) without
// reading it, where no map comes before the filter and the store has one.
//
//   builder.filter([](const Sample& s, MapContext&) { return s.at("len").values<int64_t>()[0] > 8;
//   },
//                  {.name = "long_enough"});
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/transform.h"

namespace flowstate {

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
  /// Refs pulled from the upstream in the epoch (kept and dropped): the filter's position in
  /// its upstream. Version 2; a version-1 state leaves it unknown (kUnknownSize) until the
  /// next epoch, and the filter then decides what it pulls, without a window.
  std::uint64_t consumed = 0;
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("FilterState", version, 2);
    ar(epoch, dropped);
    if (version >= 2)
      ar(consumed);
    else
      consumed = kUnknownSize;
  }
  static constexpr auto inspect_fields() {
    return std::tuple{std::pair{"epoch", &FilterState::epoch},
                      std::pair{"dropped", &FilterState::dropped},
                      std::pair{"consumed", &FilterState::consumed}};
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
  std::size_t upcoming(std::span<Ref> out) override;

 protected:
  void on_restored() override { clear_window(); }

 private:
  /// A decision made ahead: the upstream's Ref, whether it is kept, or the error deciding threw.
  struct Decided {
    Ref ref;
    char keep = 0;
    std::exception_ptr error;
  };
  /// Decides whether to keep `ref`: from the store's view (a length rule) or by reading it.
  bool decide(const Ref& ref);
  /// True when the window can work here: the upstream is indexed and the position known.
  bool windowed();
  /// Decides the upstream's next Refs after the window's end (at most `max`, 16 at first,
  /// doubling), in parallel where they must be read; false at the epoch's end.
  bool extend_window(std::size_t max);
  void clear_window();
  /// pull() through the window.
  std::size_t pull_windowed(std::span<Ref> out);

  FilterFn fn_;
  ParallelFor parallel_;
  std::uint64_t key_;
  const SampleReader* reader_;
  const RecordStore* store_;
  std::optional<LengthRule> by_length_;  ///< only where the reader has no maps
  std::vector<Ref> chunk_;
  std::vector<Ref> dropped_;
  std::vector<char> keep_;
  std::deque<Decided> window_;     ///< decisions for the upstream's [consumed, consumed + size)
  std::uint64_t window_size_ = 0;  ///< the last extension's size (grows to kFilterReadAhead)
  bool window_off_ = false;        ///< the upstream's at() disagreed with its pull()
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::FilterState, 2);
