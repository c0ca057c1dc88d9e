#include "flowstate/graph/node_stats.h"

#include "flowstate/core/error.h"

namespace flowstate {

namespace {

thread_local SpineScope* t_scope = nullptr;
thread_local std::uint32_t t_weight = 1;  ///< SpineSampling's

/// Sits between a spine node and its upstream and times the upstream's pulls; everything
/// else goes straight through. Not part of the chain: snapshots and restores never see it.
class TimedUpstream final : public SpineNode {
 public:
  TimedUpstream(SpineNode* inner, NodeCounters& counters)
      : SpineNode(inner->name()), inner_(inner), c_(counters) {}
  std::uint64_t size(std::uint64_t epoch) const override {
    try {
      return inner_->size(epoch);
    } catch (...) {
      rethrow_with_node(std::current_exception(), name());
    }
  }
  std::uint64_t positions(std::uint64_t epoch) const override {
    try {
      return inner_->positions(epoch);
    } catch (...) {
      rethrow_with_node(std::current_exception(), name());
    }
  }
  bool indexed() const override { return inner_->indexed(); }
  const SpineNode* underlying() const override { return inner_->underlying(); }
  // Not timed: a random-access read of a Ref is a few nanoseconds, called per Ref; it counts
  // as the caller's time.
  Ref at(std::uint64_t epoch, std::uint64_t i) const override { return inner_->at(epoch, i); }
  void start_epoch(std::uint64_t epoch) override {
    try {
      inner_->start_epoch(epoch);
    } catch (...) {
      rethrow_with_node(std::current_exception(), name());
    }
  }
  // The node boundary: whatever the node throws (of any type) leaves it as a flowstate error
  // naming it (rethrow_with_node); an error an upstream node already named passes unchanged.
  std::size_t pull(std::span<Ref> out) override {
    try {
      SpineScope scope(c_);
      const std::size_t n = inner_->pull(out);
      scope.set_items(n);
      return n;
    } catch (...) {
      rethrow_with_node(std::current_exception(), name());
    }
  }
  std::size_t upcoming(std::span<Ref> out) override {
    try {
      SpineScope scope(c_);  // the upstream's work (a filter deciding ahead) is its own time
      return inner_->upcoming(out);
    } catch (...) {
      rethrow_with_node(std::current_exception(), name());
    }
  }
  std::shared_ptr<const NodeSnapshot> snapshot() const override { return inner_->snapshot(); }
  bool refill(NodeSnapshot& snapshot) const override { return inner_->refill(snapshot); }
  void restore(InArchive& ar) override { inner_->restore(ar); }

 private:
  SpineNode* inner_;
  NodeCounters& c_;
};

}  // namespace

const char* node_stage_name(NodeStage stage) {
  switch (stage) {
    case NodeStage::kSpine:
      return "spine";
    case NodeStage::kAssemble:
      return "assemble";
    case NodeStage::kDeliver:
      return "deliver";
  }
  return "?";
}

std::string stats_name(const NodeSpec& spec) {
  const std::string& type = spec.description.type;
  if (spec.name == type || spec.name.rfind(type + "#", 0) == 0) return spec.name;
  return type + ":" + spec.name;
}

SpineScope::SpineScope(NodeCounters& counters) : c_(counters), parent_(t_scope), weight_(t_weight) {
  if (weight_ != 0) t0_ = stats_now_ns();
  t_scope = this;
}

SpineScope::~SpineScope() {
  t_scope = parent_;
  if (weight_ == 0) {
    c_.add(NodeStage::kSpine, 0, items_, 0);
    return;
  }
  const auto total = static_cast<std::uint64_t>(stats_now_ns() - t0_);
  const std::uint64_t own = total > child_ns_ ? total - child_ns_ : 0;
  c_.add(NodeStage::kSpine, own * weight_, items_, 0);
  c_.upstream_ns.fetch_add(child_ns_ * weight_, std::memory_order_relaxed);
  if (parent_ != nullptr) parent_->child_ns_ += total;
}

SpineSampling::SpineSampling(std::uint32_t weight) : previous_(t_weight) { t_weight = weight; }
SpineSampling::~SpineSampling() { t_weight = previous_; }

NodeCounters& NodeStatsTable::add(std::string name, std::string type, NodeStage stage) {
  NodeCounters& c = nodes_.emplace_back();
  c.name = std::move(name);
  c.type = std::move(type);
  c.stage = stage;
  return c;
}

NodeCounters* NodeStatsTable::find(const std::string& name) {
  for (auto& n : nodes_)
    if (n.name == name) return &n;
  return nullptr;
}

SpineNode* NodeStatsTable::timed(SpineNode* upstream, NodeCounters& counters) {
  timers_.push_back(std::make_unique<TimedUpstream>(upstream, counters));
  return timers_.back().get();
}

}  // namespace flowstate
