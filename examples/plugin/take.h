// `take`: passes through the first `count` samples of every epoch, then ends the epoch. A
// user's node, defined the way an in-tree node is (nodes/shard.h, nodes/filter.h): options
// table, state struct, spine node and definition in one file pair. It goes into a C++ pipeline
// with `Pipeline::Builder().add(take_node(), TakeOptions{.count = 5000})`, and into YAML
// (`- take: {count: 5000}`) through the plugin in plugin.cpp.
//
// Its state is the epoch and the number of samples taken: the upstream restores its own
// position, so nothing else needs saving. It pulls no more than it passes on, so it holds no
// samples between pulls.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"

// A namespace of its own: once loaded, a plugin's symbols that the program also defines resolve
// to the program's, so a plugin must not define names flowstate may define (its own `take`).
namespace flowstate::examples {

/// Options of the `take` node.
struct TakeOptions {
  std::uint64_t count = 0;  ///< samples kept at the start of each epoch

  static constexpr auto table() {
    return std::tuple{
        param("count", &TakeOptions::count,
              {.min = 1, .required = true, .doc = "samples kept at the start of each epoch"})};
  }
};

/// The `take` node's definition.
const NodeDef& take_node();

/// State of a take: the epoch and how many of its samples were passed on.
struct TakeState {
  std::uint64_t epoch = 0;
  std::uint64_t taken = 0;  ///< <= count
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("TakeState", version, 1);
    ar(epoch, taken);
  }
  static constexpr auto inspect_fields() {
    return std::tuple{std::pair{"epoch", &TakeState::epoch}, std::pair{"taken", &TakeState::taken}};
  }
};

/// The `take` spine node.
class TakeNode final : public StatefulSpineNode<TakeState> {
 public:
  /// Throws ConfigError when `count` is 0.
  TakeNode(std::string name, std::uint64_t count);

  /// min(count, upstream size); kUnknownSize when the upstream's size is unknown.
  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  /// Pulls at most what is left of `count` from the upstream.
  std::size_t pull(std::span<Ref> out) override;

 protected:
  /// Refuses a state that took more than `count`.
  void validate(const TakeState& s) const override;

 private:
  std::uint64_t count_;
};

}  // namespace flowstate::examples

CEREAL_CLASS_VERSION(flowstate::examples::TakeState, 1);
