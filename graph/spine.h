// Spine: the instantiated stateful chain of a pipeline (source or mix → shard → shuffle →
// filter / pack → batch planner). It runs serially and stamps each planned batch with the
// snapshots of every node.
//
// Filters and pack read samples in the spine through a SampleReader: the current store (the
// source's, or a pack's rows) with the per-sample maps seen since that store. The batch
// assembler reads the planned Refs the same way from the last store, applying the maps after it.
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

  /// The store the assembler reads planned Refs from.
  const RecordStore* store() const { return chain_.store; }
  /// The node that owns store(), for errors.
  const std::string& source_name() const { return chain_.store_name; }
  /// The per-sample maps the assembler applies (those after the last store).
  const std::vector<SampleStage>& sample_stages() const { return chain_.stages; }
  BatchPlanner& planner() { return *planner_; }

  /// An instantiated stretch of a pipeline: nodes, and what reads their Refs.
  struct Chain {
    std::vector<std::unique_ptr<SpineNode>> nodes;  ///< connected, in order
    std::vector<std::unique_ptr<SampleReader>> readers;
    const RecordStore* store = nullptr;
    std::string store_name;
    std::vector<SampleStage> stages;  ///< maps since `store`
  };
  /// Instantiates `pipeline`'s nodes up to (not including) its batch node; Refs of its
  /// source carry `source_id`.
  static Chain build_chain(const Pipeline& pipeline, std::uint32_t source_id);

 private:
  Chain chain_;  ///< source first, planner last
  BatchPlanner* planner_ = nullptr;
};

/// The random key of the node at `index` of type `type` in a pipeline seeded with `seed`.
std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type);

}  // namespace flowstate
