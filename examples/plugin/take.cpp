#include "examples/plugin/take.h"

#include <algorithm>
#include <memory>

#include "flowstate/core/error.h"

namespace flowstate::examples {

const NodeDef& take_node() {
  static const NodeDef def = define_node<TakeOptions>(
      {.type = "take",
       .phase = Phase::kPerSample,
       .doc = "keeps the first `count` samples of every epoch, then ends the epoch"},
      [](BuildContext& ctx, const TakeOptions& o) {
        ctx.add(std::make_unique<TakeNode>(ctx.name(), o.count));
      },
      inspect_fields<TakeState>);
  return def;
}

TakeNode::TakeNode(std::string name, std::uint64_t count)
    : StatefulSpineNode(std::move(name)), count_(count) {
  if (count_ == 0) throw ConfigError(this->name() + ".count", "take needs a count of at least 1");
}

std::uint64_t TakeNode::size(std::uint64_t epoch) const {
  const std::uint64_t n = upstream_->size(epoch);
  return n == kUnknownSize ? kUnknownSize : std::min(n, count_);
}

void TakeNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_ = {epoch, 0};
}

std::size_t TakeNode::pull(std::span<Ref> out) {
  // Never more than is left to take: the rest of the upstream's epoch is not read at all.
  const auto want =
      static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), count_ - state_.taken));
  if (want == 0) return 0;
  const std::size_t got = upstream_->pull(out.first(want));
  state_.taken += got;
  return got;
}

void TakeNode::validate(const TakeState& s) const {
  if (s.taken > count_)
    throw CheckpointError(name(), "take state has taken " + std::to_string(s.taken) +
                                      " samples, more than its count " + std::to_string(count_));
}

}  // namespace flowstate::examples
