// Spine: the instantiated stateful chain of a pipeline (a source or mix → shard → shuffle →
// filter / pack / user nodes → batch planner), built by calling every node definition's build
// with a BuildContext. It runs serially and stamps each planned batch with the snapshots of
// every node.
//
// Filters and pack read samples in the spine through a SampleReader: the current store (the
// source's, or a pack's rows) with the per-sample maps seen since that store. The batch
// assembler reads the planned Refs the same way from the last store, applying the maps after it.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "flowstate/graph/pipeline.h"

namespace flowstate {

/// What the nodes from `batch` on hand the runtime (AssemblyStage, nodes/assembly.h): the
/// runtime reads it when it wires the graph.
struct SinkConfig {
  std::unique_ptr<BatchPlanner> planner;  ///< the batch node's, until the spine takes it
  std::string batch_name;                 ///< the node that handed the planner
  UserCollateFn user_collate;             ///< the source's, used when `batch` names none
  std::vector<PlanStage> plan_stages;
  std::vector<BatchStage> batch_stages;
  std::optional<std::size_t> prefetch;
  /// Deliver stages in order, with their nodes' names.
  std::vector<std::pair<std::string, std::shared_ptr<DeliverStage>>> deliver;
};

class NodeStatsTable;
struct NodeCounters;
class ReadPlanner;

/// The stateful spine of one running pipeline. Not thread-safe.
class Spine {
 public:
  /// Instantiates the pipeline's nodes (opening the data) and the planner. With `stats`, every
  /// node gets its counters there and the spine nodes' pulls are timed (graph/node_stats.h);
  /// `stats` must outlive the spine.
  Spine(const Pipeline& pipeline, std::uint64_t epochs, NodeStatsTable* stats = nullptr);

  /// The next scheduled batch, stamped; nullopt after the last epoch. Its Refs are handed to
  /// the store first when the store plans its reads (nodes/read_plan.h).
  std::optional<BatchPlan> next();
  /// The current state of every node.
  Stamp snapshot() const;
  /// Loads every node from a serialized stamp; throws CheckpointError when it does not fit.
  /// With `change`, the nodes whose data parameters changed carry their state over (DataChange).
  void restore(std::string_view bytes, const DataChange* change = nullptr);
  void set_skips(SkipRanges skips) { planner_->set_skips(std::move(skips)); }

  /// The store the assembler reads planned Refs from.
  const RecordStore* store() const { return chain_.store; }
  /// The node that owns store(), for errors.
  const std::string& source_name() const { return chain_.store_name; }
  /// The per-sample maps the assembler applies (those after the last store).
  const std::vector<SampleStage>& sample_stages() const { return *chain_.stages; }
  /// Batch maps, prefetch depth and deliver stages, as the pipeline's nodes set them.
  const SinkConfig& sink() const { return sink_; }
  BatchPlanner& planner() { return *planner_; }

  /// Instantiates `pipeline`'s nodes before its batch node; Refs of its source carry
  /// `source_id`. `sink` receives what the nodes from batch on configure (null: none may).
  /// With `stats`, nodes are counted there under `prefix` + their stats name, and
  /// `last_counters` receives the chain's last node's counters.
  static Chain build_chain(const Pipeline& pipeline, std::uint32_t source_id, SinkConfig* sink,
                           NodeStatsTable* stats = nullptr, const std::string& prefix = "",
                           NodeCounters** last_counters = nullptr);

 private:
  Chain chain_;  ///< source first, planner last
  SinkConfig sink_;
  BatchPlanner* planner_ = nullptr;
  NodeCounters* planner_counters_ = nullptr;
  /// The stamps handed out, reused once dropped: a waiting one keeps its snapshots (copies of
  /// node states, refilled in place by the next stamp: snapshot_nodes).
  mutable Recycler<StampData> stamps_;
  /// The store, when it downloads ahead along the planned order (nodes/read_plan.h); else null.
  const ReadPlanner* read_planner_ = nullptr;
  /// planner_->next(), timed as the batch node's when node stats are on.
  std::optional<BatchPlan> plan_next();
};

/// The random key of the node at `index` of type `type` in a pipeline seeded with `seed`.
std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type);

/// The runtime's parallel loop (oneTBB), handed to nodes through BuildContext.
const ParallelFor& runtime_parallel_for();

}  // namespace flowstate
