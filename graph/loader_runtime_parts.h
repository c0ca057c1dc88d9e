// The parts of Loader::Runtime (graph/loader_runtime.h) that stand on their own: the messages
// between its TBB nodes, the process-wide TBB thread lease, how many workers and how deep a
// queue a Loader runs (fixed or tuned), the limiter whose threshold moves while the graph runs,
// and the timer of a stage body. Internal: included by loader_runtime.h only, not installed.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>

#include "flowstate/graph/autotune.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/loader_observer.h"
#include "flowstate/graph/spine.h"

namespace flowstate {

namespace flow = oneapi::tbb::flow;

// Named (not anonymous) because this is a header.
namespace loader_detail {

using Clock = std::chrono::steady_clock;
inline std::uint64_t elapsed_ns(Clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

/// A stage body's accounting on every way out of it: adds the time from construction to
/// destruction to `ns` and `count` (the batches it handled) to `items`, and stamps `end_ns`
/// (when given) with the end.
class StageTimer {
 public:
  StageTimer(std::atomic<std::uint64_t>& ns, std::atomic<std::uint64_t>& items,
             std::int64_t* end_ns = nullptr)
      : ns_(ns), items_(items), end_ns_(end_ns) {}
  ~StageTimer() {
    ns_ += elapsed_ns(t0_);
    items_ += count;
    if (end_ns_ != nullptr) *end_ns_ = stats_now_ns();
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  std::uint64_t count = 1;

 private:
  std::atomic<std::uint64_t>& ns_;
  std::atomic<std::uint64_t>& items_;
  std::int64_t* end_ns_;
  Clock::time_point t0_ = Clock::now();
};

/// A group of consecutive planned batches travelling through the graph, then possibly the end
/// marker or a spine error. Cheap batches travel several to a message so that the hand-offs
/// between threads (a few tens of µs each on a loaded machine) do not cost more than the
/// batches (see group_size()).
struct PlanMsg {
  std::uint64_t seq = 0;                          ///< the group's, in planning order
  std::shared_ptr<std::vector<BatchPlan>> plans;  // shared_ptr: TBB buffers copy messages
  std::exception_ptr error;                       ///< after the plans
  bool end = false;                               ///< after the plans
};

/// One finished batch (or end / error), as the consumer takes it.
struct ItemMsg {
  std::shared_ptr<Batch> batch;
  std::exception_ptr error;
  bool end = false;
  bool last_of_group = false;  ///< taking it frees the group's in-flight slot
};

/// A finished group, in sequence order: its batches, then its end or error.
struct GroupMsg {
  std::uint64_t seq = 0;
  std::shared_ptr<std::vector<ItemMsg>> items;
};

/// How many batches the spine plans into one message. Each message pays a fixed cost for its
/// hand-offs (spine → worker → reorder → deliver → consumer, and the slot back); a group is
/// made big enough that its work (`batch_ns` per batch, measured) is at least
/// kGroupTargetNs, and small enough to stay under kGroupMaxBytes (`batch_bytes` per batch).
/// Batches that cost more than the target travel alone. The schedule never changes the
/// batches: groups are consecutive plans, each stamped as before.
///
/// The caps keep a group small enough for the workers and the spine to overlap and for one
/// worker's group to stay in its core's cache (a core's L2 is 1–2 MiB on current servers)
/// until the consumer takes it: on a 2-core VM with 2 workers, W1 (256 KiB batches) ran
/// 0.82–0.92× the wall time with groups of at most 1 MiB (4 batches) than with 4 MiB (16), and
/// W2 (32 KiB batches, a few µs each) 0.93–0.96× with groups of 12 than of 32; text batches of
/// 1 KiB were unchanged (bench/RESULTS.md, "Issue 26: smaller groups").
inline constexpr std::uint64_t kGroupTargetNs = 500'000;
inline constexpr std::uint64_t kGroupMaxBytes = 1u << 20;
inline constexpr std::size_t kGroupMax = 12;
inline std::size_t group_size(std::uint64_t batch_ns, std::uint64_t batch_bytes) {
  if (batch_ns == 0) return 1;  // nothing measured yet: the first batch goes alone
  std::uint64_t k = kGroupTargetNs / batch_ns;
  if (batch_bytes > 0) k = std::min<std::uint64_t>(k, kGroupMaxBytes / batch_bytes);
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(k, 1, kGroupMax));
}
/// The most batches `workers: inline` makes at once (Runtime::make_inline).
inline constexpr std::size_t kInlineGroupMax = 8;

/// Raises TBB's process-wide thread limit while any Loader needs more threads than the
/// machine has cores. TBB applies the *smallest* of the active global_control limits, so all
/// Loaders share one control set to the largest request.
class ParallelismLease {
 public:
  explicit ParallelismLease(std::size_t threads) : threads_(threads) {
    std::lock_guard lock(mu());
    requests().insert(threads_);
    update();
  }
  ~ParallelismLease() {
    std::lock_guard lock(mu());
    requests().erase(requests().find(threads_));
    update();
  }
  ParallelismLease(const ParallelismLease&) = delete;
  ParallelismLease& operator=(const ParallelismLease&) = delete;

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::multiset<std::size_t>& requests() {
    static std::multiset<std::size_t> r;
    return r;
  }
  static std::unique_ptr<oneapi::tbb::global_control>& control() {
    static std::unique_ptr<oneapi::tbb::global_control> c;
    return c;
  }
  static std::size_t& current() {
    static std::size_t n = 0;
    return n;
  }
  static void update() {
    std::size_t want = requests().empty() ? 0 : *requests().rbegin();
    if (want == current()) return;
    control().reset();  // the old limit must go first: the smallest active one wins
    if (want > std::thread::hardware_concurrency())
      control() = std::make_unique<oneapi::tbb::global_control>(
          oneapi::tbb::global_control::max_allowed_parallelism, want);
    current() = want;
  }
  std::size_t threads_;
};

/// The batch-assembly workers: LoaderOptions::workers, else the largest of the pipeline's and
/// its maps' (kAuto, 0: tuned — when the pipeline's is auto and no map sets its own; kInline,
/// -1: on the consumer's thread — when the pipeline's is inline and no map sets its own).
inline int assembly_workers(const Pipeline& p, const LoaderOptions& o) {
  if (o.workers)
    return *o.workers == static_cast<int>(kAuto) || *o.workers == static_cast<int>(kInline)
               ? *o.workers
               : std::max(1, *o.workers);
  int w = p.workers();
  for (const auto& n : p.nodes())
    if (n.workers) w = std::max(w, *n.workers);
  return w;
}

/// The prefetch depth: LoaderOptions::prefetch, else the pipeline's (kAuto, 0: tuned).
inline std::size_t prefetch_depth(const Spine& spine, const LoaderOptions& o) {
  if (o.prefetch) return *o.prefetch;
  return spine.sink().prefetch.value_or(2);
}

/// Workers at most with `workers: auto`: the function node is built with this concurrency and
/// the tuner's choice gates it (LimiterSlots). Twice the cores, for assemblies that wait on I/O.
inline int max_auto_workers() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::clamp(2 * cores, 4, 64);
}
inline constexpr std::size_t kMaxAutoDepth = 64;  ///< prefetch depth at most with `auto`
inline constexpr std::size_t kAutoStartDepth = 4;

/// Gives a limiter_node built with its largest threshold a smaller one that can change while
/// the graph runs: the slots above the target are held as if taken (a negative decrement
/// takes them; a message that finishes while the target is lower keeps its slot instead of
/// freeing it), and a raised target frees held ones. The limiter's count never passes its
/// threshold, so TBB never clamps it and no slot is lost. Thread-safe.
class LimiterSlots {
 public:
  using Node = flow::limiter_node<PlanMsg, long long>;
  /// Before the graph runs: `node`'s threshold is `max`, of which `target` slots are used.
  void init(Node* node, std::size_t max, std::size_t target) {
    node_ = node;
    max_ = max;
    held_ = max_ - std::clamp<std::size_t>(target, 1, max_);
    to_hold_ = 0;
    if (held_ > 0) node_->decrementer().try_put(-static_cast<long long>(held_));
  }
  /// A message that took a slot is done: frees the slot, or holds it while above target.
  void release() {
    {
      std::lock_guard lock(mu_);
      if (to_hold_ > 0) {
        --to_hold_;
        ++held_;
        return;
      }
    }
    node_->decrementer().try_put(1);
  }
  /// Slots usable from now on (as messages finish, when lower).
  void set_target(std::size_t target) {
    std::size_t give = 0;
    {
      std::lock_guard lock(mu_);
      const std::size_t want = max_ - std::clamp<std::size_t>(target, 1, max_);
      const std::size_t have = held_ + to_hold_;
      if (want > have) {
        to_hold_ += want - have;
      } else {
        give = have - want;
        const std::size_t cancelled = std::min(give, to_hold_);
        to_hold_ -= cancelled;
        give -= cancelled;
        held_ -= give;
      }
    }
    if (give > 0) node_->decrementer().try_put(static_cast<long long>(give));
  }

 private:
  Node* node_ = nullptr;
  std::size_t max_ = 0;
  std::mutex mu_;
  std::size_t held_ = 0;     ///< slots taken out of use
  std::size_t to_hold_ = 0;  ///< slots still to take out, as messages finish
};

}  // namespace loader_detail

}  // namespace flowstate
