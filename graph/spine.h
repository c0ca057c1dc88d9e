// Spine: the instantiated stateful chain of a pipeline (source → shard → shuffle → batch
// planner). It runs serially and stamps each planned batch with the snapshots of every node.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "graph/pipeline.h"

namespace flowstate {

/// The stateful spine of one running pipeline. Not thread-safe.
class Spine {
 public:
  /// Instantiates the pipeline's source and spine nodes (opening the data) and the planner.
  Spine(const Pipeline& pipeline, std::uint64_t epochs);

  /// The next scheduled batch, stamped; nullopt after the last epoch.
  std::optional<BatchPlan> next();
  /// The current state of every node.
  Stamp snapshot() const;
  /// Loads every node from a serialized stamp; throws CheckpointError when it does not fit.
  void restore(std::string_view bytes);
  void set_skips(SkipRanges skips) { planner_->set_skips(std::move(skips)); }

  const RecordStore* store() const { return store_; }
  const std::string& source_name() const { return nodes_.front()->name(); }
  BatchPlanner& planner() { return *planner_; }

 private:
  std::vector<std::unique_ptr<SpineNode>> nodes_;  ///< source first, planner last
  BatchPlanner* planner_ = nullptr;
  const RecordStore* store_ = nullptr;
};

/// The random key of the node at `index` of type `type` in a pipeline seeded with `seed`.
std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type);

}  // namespace flowstate
