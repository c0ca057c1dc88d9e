#include "graph/spine.h"

#include <sstream>

#include <cereal/types/string.hpp>

#include "core/error.h"
#include "core/hash.h"

namespace flowstate {

std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type) {
  return hash_combine(hash_combine(seed, index), hash64(type));
}

Spine::Spine(const Pipeline& pipeline, std::uint64_t epochs) {
  const auto& specs = pipeline.nodes();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const NodeSpec& spec = specs[i];
    std::unique_ptr<SpineNode> node;
    if (spec.kind == NodeSpec::Kind::kSource) {
      SourceParts parts = spec.make_source(spec.name, 0);
      store_ = parts.store;
      node = std::move(parts.node);
    } else if (spec.kind == NodeSpec::Kind::kSpine) {
      node = spec.make_spine(spec.name, node_key(pipeline.seed(), i, spec.description.type));
    } else if (spec.kind == NodeSpec::Kind::kBatch) {
      auto planner = std::make_unique<BatchPlanner>(spec.name, spec.batch);
      planner_ = planner.get();
      node = std::move(planner);
    } else {
      continue;
    }
    node->connect(nodes_.empty() ? nullptr : nodes_.back().get());
    nodes_.push_back(std::move(node));
  }
  planner_->set_epochs(epochs);
}

std::optional<BatchPlan> Spine::next() {
  std::optional<BatchPlan> plan = planner_->next();
  if (plan) plan->stamp = snapshot();
  return plan;
}

Stamp Spine::snapshot() const {
  auto s = std::make_shared<StampData>();
  s->node_names.reserve(nodes_.size());
  s->snapshots.reserve(nodes_.size());
  for (const auto& n : nodes_) {
    s->node_names.push_back(n->name());
    s->snapshots.push_back(n->snapshot());
  }
  return s;
}

void Spine::restore(std::string_view bytes) {
  std::istringstream is{std::string(bytes), std::ios::binary};
  try {
    InArchive ar(is);
    StateReadLimit limit(bytes.size());
    std::uint32_t count = 0;
    ar(count);
    if (count != nodes_.size())
      throw CheckpointError("state", "the state holds " + std::to_string(count) +
                                         " stateful nodes, this pipeline has " +
                                         std::to_string(nodes_.size()));
    for (const auto& n : nodes_) {
      std::string name;
      load_bounded(ar, name);
      if (name != n->name())
        throw CheckpointError("state", "the state holds node '" + name +
                                           "' where this pipeline has '" + n->name() + "'");
      n->restore(ar);
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError("state",
                          std::string("node states are truncated or corrupt: ") + e.what());
  }
}

}  // namespace flowstate
