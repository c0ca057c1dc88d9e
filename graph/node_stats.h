// Per-node accounting of a running Loader: busy time, calls, items and bytes of every node of
// the pipeline, by name, kept always on (a few relaxed atomic adds per node per batch).
//
// A node runs in one of three places (NodeStage): the serial spine (sources, shard, shuffle,
// filter, pack, mix, the batch planner), the parallel assembly (reading records, per-sample
// maps, collation, batch maps; `workers` threads), or the serial deliver step (device_copy).
// Spine nodes call each other (a node's pull calls its upstream's), so each is timed by a
// TimedUpstream placed between it and the node that pulls from it, and keeps only its own
// (exclusive) time: the time inside its upstream is its wait on input. The runtime adds the
// assembly's times stage by stage per batch (BatchAssembler::assemble's AssemblyTimes).
//
// Thread-safety: counters are relaxed atomics (a reader sees each counter's latest value, not
// a consistent cut across counters); the table's structure is fixed once the spine is built.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

/// Where a node's work runs.
enum class NodeStage : std::uint8_t {
  kSpine,     ///< the serial spine thread
  kAssemble,  ///< the parallel batch-assembly workers
  kDeliver,   ///< the serial deliver step (device_copy)
};
/// "spine", "assemble", "deliver".
const char* node_stage_name(NodeStage stage);

/// The name a node is reported under: its type, or "type:name" when its name is not its
/// type's ("map:random_crop", "filter:long_enough"; "records", "shuffle", "map#2" stay).
std::string stats_name(const NodeSpec& spec);

/// The monotonic clock of stats and traces, in nanoseconds.
inline std::int64_t stats_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The counters of one node. Written by the graph's threads, read by stats().
struct NodeCounters {
  std::string name;  ///< stats_name()
  std::string type;  ///< the node's type ("map")
  /// Where most of its work runs: its waits are that stage's. (The batch node plans in the
  /// spine and collates in the assembly; a source is pulled in the spine and read in the
  /// assembly: busy_ns keeps each stage's part.)
  NodeStage stage = NodeStage::kSpine;
  std::atomic<std::uint64_t> calls{0};  ///< pulls (spine) or batches (assembly, deliver)
  std::atomic<std::uint64_t> items{0};  ///< Refs (spine) or samples (assembly) out
  std::atomic<std::uint64_t> bytes{0};  ///< bytes of the samples or batch it made
  /// Own time in each NodeStage, summed over threads.
  std::atomic<std::uint64_t> busy_ns[3] = {0, 0, 0};
  /// Spine nodes: time inside the upstream's pull (waiting for input to be made).
  std::atomic<std::uint64_t> upstream_ns{0};
  std::uint16_t trace_id = 0;  ///< the node's name in the trace (Tracer::intern)

  /// Adds a call's time to stage `where`. Calls and items count only in the node's own stage
  /// (`stage`), so a node working in two stages (batch: plans, then collates) counts each
  /// batch once; bytes count wherever they are made.
  void add(NodeStage where, std::uint64_t ns, std::uint64_t n_items, std::uint64_t n_bytes) {
    if (where == stage) {
      calls.fetch_add(1, std::memory_order_relaxed);
      items.fetch_add(n_items, std::memory_order_relaxed);
    }
    if (n_bytes != 0) bytes.fetch_add(n_bytes, std::memory_order_relaxed);
    busy_ns[static_cast<int>(where)].fetch_add(ns, std::memory_order_relaxed);
  }
  std::uint64_t busy(NodeStage where) const {
    return busy_ns[static_cast<int>(where)].load(std::memory_order_relaxed);
  }
  std::uint64_t total_busy() const {
    return busy(NodeStage::kSpine) + busy(NodeStage::kAssemble) + busy(NodeStage::kDeliver);
  }
};

/// Times one call of a spine node: its own time goes to `counters.busy_ns`, the time spent in
/// nested SpineScopes (its upstream's pulls) to `counters.upstream_ns`. Scopes nest per thread.
/// Calls and items always count; the clock is read only while spine timing is sampled in
/// (SpineSampling), and the times then count `weight` times.
class SpineScope {
 public:
  explicit SpineScope(NodeCounters& counters);
  ~SpineScope();
  SpineScope(const SpineScope&) = delete;
  SpineScope& operator=(const SpineScope&) = delete;
  /// Items the call produced.
  void set_items(std::uint64_t n) { items_ = n; }

 private:
  NodeCounters& c_;
  SpineScope* parent_;
  std::uint32_t weight_;
  std::int64_t t0_ = 0;
  std::uint64_t child_ns_ = 0;
  std::uint64_t items_ = 0;
};

/// Spine timing is sampled by plan: a spine node's pull takes tens of ns and the spine pulls
/// per document, so two clock reads per pull per node cost ~9% of a text pipeline's spine
/// (mixed_text). The runtime times one plan in kSpineSampling, whose times count that many
/// times: busy times are estimates over many plans (plans are alike), calls and items stay
/// exact. Scoped per thread; outside any SpineSampling every call is timed (weight 1).
class SpineSampling {
 public:
  /// `weight`: 0 to read no clock in this scope, else the weight of its times.
  explicit SpineSampling(std::uint32_t weight);
  ~SpineSampling();
  SpineSampling(const SpineSampling&) = delete;
  SpineSampling& operator=(const SpineSampling&) = delete;

 private:
  std::uint32_t previous_;
};
inline constexpr std::uint32_t kSpineSampling = 4;

/// Every node's counters, in pipeline order (mix inputs' nodes after the mix, named
/// "mix[0]/lines"). Owns the TimedUpstreams of the spine, so it must outlive the spine.
class NodeStatsTable {
 public:
  /// Adds a node; the reference stays valid for the table's life.
  NodeCounters& add(std::string name, std::string type, NodeStage stage);
  /// The node named `name`, or null.
  NodeCounters* find(const std::string& name);
  const std::deque<NodeCounters>& nodes() const { return nodes_; }
  std::deque<NodeCounters>& nodes() { return nodes_; }
  /// Wraps `upstream` (whose counters are `counters`) so that its pulls are timed.
  SpineNode* timed(SpineNode* upstream, NodeCounters& counters);

 private:
  std::deque<NodeCounters> nodes_;
  std::vector<std::unique_ptr<SpineNode>> timers_;
};

}  // namespace flowstate
