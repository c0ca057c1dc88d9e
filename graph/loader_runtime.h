// Loader::Runtime: one running instance of a Loader's graph — the spine on its serial input
// node, the TBB nodes that assemble and deliver batches, the consumer's queue and their
// counters. The Loader's own half (state, checkpoints, metrics, next()) is graph/loader.cpp;
// the longer bodies of this class are graph/loader_runtime.cpp. Those two are the only files
// that include this one; it is not installed. Its self-contained parts (messages,
// thread lease, worker and depth choice, the movable limiter, the stage timer) are
// graph/loader_runtime_parts.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/autotune.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/loader_observer.h"
#include "flowstate/graph/loader_runtime_parts.h"
#include "flowstate/graph/spine.h"

namespace flowstate {

using namespace loader_detail;  // NOLINT: included by graph/loader.cpp and loader_runtime.cpp only

/// One running instance of the graph: spine, TBB nodes and the consumer queue.
class Loader::Runtime {
 public:
  Runtime(const Pipeline& pipeline, const LoaderOptions& options, Tracer* tracer)
      : tracer_(tracer),
        spine_(pipeline, options.epochs, options.node_stats ? &stats_ : nullptr),
        node_stats_(options.node_stats),
        inline_(assembly_workers(pipeline, options) == static_cast<int>(kInline)),
        auto_workers_(assembly_workers(pipeline, options) == 0),
        auto_depth_(prefetch_depth(spine_, options) == kAuto),
        max_workers_(auto_workers_ ? max_auto_workers()
                                   : std::max(1, assembly_workers(pipeline, options))),
        max_depth_(auto_depth_ ? kMaxAutoDepth : prefetch_depth(spine_, options)),
        workers_(auto_workers_
                     ? std::min(max_workers_,
                                static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
                     : max_workers_),
        depth_(auto_depth_ ? kAutoStartDepth : max_depth_),
        // Enough TBB threads for the workers plus the serial input and output nodes, also on
        // small machines where the default pool would starve the graph. Inline: no graph and
        // no TBB thread (a lease of 0 asks for nothing).
        lease_(inline_ ? 0 : static_cast<std::size_t>(max_workers_) + 2),
        arena_(max_workers_ + 1, 0) {
    if (!inline_ && (auto_workers_ || auto_depth_)) {
      AutotuneLimits limits;
      limits.workers = auto_workers_;
      limits.depth = auto_depth_;
      limits.max_workers = max_workers_;
      limits.max_depth = max_depth_;
      limits.memory_budget =
          options.memory_budget != 0 ? options.memory_budget : default_memory_budget();
      Autotuner::Tuning tuning;
      tuning.min_depth = kAutoStartDepth;  // a step down returns to where the tuner started
      tuner_.emplace(limits, AutotuneSetting{workers_.load(), depth_.load()}, tuning);
      tune_interval_ns_ =
          static_cast<std::int64_t>(std::max(options.autotune_interval_s, 1e-3) * 1e9);
    }
    const SinkConfig& sink = spine_.sink();
    std::shared_ptr<BufferPool> pool;
    for (const auto& [name, stage] : sink.deliver) {
      deliver_.push_back({name, stage, nullptr});
      if (!pool) pool = stage->staging_pool();
    }
    if (!pool) pool = BufferPool::host();
    assembler_ = std::make_unique<BatchAssembler>(
        spine_.store(), spine_.source_name(), spine_.planner().options(), spine_.sample_stages(),
        sink.batch_stages, std::move(pool));
    // Every assembly stage and the device copy count for their node (by the node's name).
    std::unordered_map<std::string, std::string> stats_names;
    for (const auto& spec : pipeline.nodes()) stats_names[spec.name] = stats_name(spec);
    const auto phase_of = [&](const std::string& node) {
      for (const auto& spec : pipeline.nodes())
        if (spec.name == node) return spec.phase();
      return Phase::kPerSample;
    };
    auto counters_of = [&](const std::string& node) -> NodeCounters* {
      auto it = stats_names.find(node);
      return it == stats_names.end() ? nullptr : stats_.find(it->second);
    };
    for (const auto& name : assembler_->stage_names(sink.batch_name))
      assembly_nodes_.push_back(counters_of(name));
    // A source's work is reading its records, in the assembly (its pulls are a cursor moving);
    // a store made in the spine (pack) does its work there.
    if (!assembly_nodes_.empty() && assembly_nodes_[0] != nullptr &&
        phase_of(spine_.source_name()) == Phase::kSource)
      assembly_nodes_[0]->stage = NodeStage::kAssemble;
    for (auto& d : deliver_) d.counters = counters_of(d.name);
    if (tracer_ != nullptr) {
      for (auto& n : stats_.nodes()) n.trace_id = tracer_->intern(n.name);
      in_flight_name_ = tracer_->intern("batches in flight");
      consumer_wait_name_ = tracer_->intern("wait for a batch");
    }
  }

  ~Runtime() { stop(); }

  Spine& spine() { return spine_; }

  /// Builds and starts the graph (inline: no graph; take() makes each batch). The spine must
  /// be in its starting state.
  void start() {
    if (inline_) {
      start_ns_ = stats_now_ns();
      started_ = true;
      return;
    }
    arena_.execute([&] {
      graph_ = std::make_unique<flow::graph>();
      input_ = std::make_unique<flow::input_node<PlanMsg>>(
          *graph_, [this](oneapi::tbb::flow_control& fc) { return plan_next(fc); });
      // Slots: batches being assembled, waiting for order, and waiting for the consumer.
      const std::size_t max_in_flight = max_depth_ + static_cast<std::size_t>(max_workers_);
      limiter_ = std::make_unique<LimiterSlots::Node>(*graph_, max_in_flight);
      work_ = std::make_unique<flow::function_node<PlanMsg, GroupMsg>>(
          *graph_, static_cast<std::size_t>(max_workers_),
          [this](const PlanMsg& m) { return assemble(m); });
      order_ = std::make_unique<flow::sequencer_node<GroupMsg>>(
          *graph_, [](const GroupMsg& m) { return static_cast<std::size_t>(m.seq); });
      sink_ = std::make_unique<flow::function_node<GroupMsg, flow::continue_msg>>(
          *graph_, flow::serial, [this](const GroupMsg& m) {
            deliver(m);
            return flow::continue_msg();
          });
      flow::make_edge(*input_, *limiter_);
      if (auto_workers_) {
        // The tuned worker count gates a function node built for the most: plans wait in a
        // queue for one of the gate's slots (one per active worker; assemble() frees it).
        plan_queue_ = std::make_unique<flow::queue_node<PlanMsg>>(*graph_);
        gate_ =
            std::make_unique<LimiterSlots::Node>(*graph_, static_cast<std::size_t>(max_workers_));
        flow::make_edge(*limiter_, *plan_queue_);
        flow::make_edge(*plan_queue_, *gate_);
        flow::make_edge(*gate_, *work_);
        gate_slots_.init(gate_.get(), static_cast<std::size_t>(max_workers_),
                         static_cast<std::size_t>(workers_.load()));
      } else {
        flow::make_edge(*limiter_, *work_);
      }
      flow::make_edge(*work_, *order_);
      flow::make_edge(*order_, *sink_);
      in_flight_slots_.init(limiter_.get(), max_in_flight, in_flight_target());
      start_ns_ = stats_now_ns();
      input_->activate();
    });
    started_ = true;
  }

  bool started() const { return started_; }
  /// Neither started nor restored: the spine is in its starting state.
  bool pristine() const { return !started_ && !restored_; }
  void note_restored() { restored_ = true; }

  LoaderStats stats();

  /// Blocks until the next item in sequence order is ready and releases its limiter slot.
  /// The consumer takes every ready batch at once into its own queue and serves the next
  /// calls from there without the lock: deliver() and take() meet once per refill, not once
  /// per batch (on a loaded 2-core machine each meeting on a held lock is a futex wake-up).
  ItemMsg take() {
    if (tuner_) maybe_tune();
    if (inline_ && taken_queue_.empty()) make_inline();
    if (!taken_queue_.empty()) {
      if (taken_groups_ + groups_ready_.load(std::memory_order_relaxed) >= in_flight_target())
        graph_waits_.fetch_add(1, std::memory_order_relaxed);
    } else {
      // An event count, not a condition variable: the consumer reads delivered_, looks at the
      // queue, and sleeps on delivered_ only while it still holds what it read — one futex
      // wait and one wake per empty queue, where the condition variable's wait, wake and
      // mutex hand-back made six (bench/RESULTS.md, issue 26).
      bool waited = false;
      std::int64_t t0 = 0, t1 = 0;
      for (;;) {
        const std::uint32_t seen = delivered_.load(std::memory_order_acquire);
        {
          std::lock_guard lock(mu_);
          if (!queue_.empty()) {
            if (waited) {
              t1 = stats_now_ns();
              consumer_wait_ns_ += static_cast<std::uint64_t>(t1 - t0);
            } else if (groups_ready_.load(std::memory_order_relaxed) >= in_flight_target()) {
              graph_waits_.fetch_add(1, std::memory_order_relaxed);
            }
            taken_queue_.swap(queue_);  // queue_ is left empty
            taken_groups_ = groups_ready_.exchange(0, std::memory_order_relaxed);
            break;
          }
          if (!waited) {
            waited = true;
            ++consumer_waits_;
            t0 = stats_now_ns();
          }
        }
        delivered_.wait(seen, std::memory_order_acquire);
      }
      if (waited && tracer_ != nullptr) {
        const ItemMsg& front = taken_queue_.front();
        const auto step = front.batch ? static_cast<std::int64_t>(front.batch->info.step) : -1;
        tracer_->span(Tracer::kConsumer, consumer_wait_name_, t0, t1, step);
      }
    }
    ItemMsg m = std::move(taken_queue_.front());
    taken_queue_.pop_front();
    if (m.last_of_group) --taken_groups_;
    if (m.batch) {
      const std::uint64_t taken = taken_.fetch_add(1, std::memory_order_relaxed) + 1;
      if (tracer_ != nullptr) {
        const std::int64_t now = stats_now_ns();
        if (counter_due(now))
          tracer_->counter(in_flight_name_, now,
                           static_cast<double>(planned_.load(std::memory_order_relaxed) - taken));
      }
    }
    // Not through arena_.execute: an external thread that finds every arena slot busy would
    // wait for a worker to run the call. A try_put from outside submits its task to the
    // graph's arena and returns.
    if (m.last_of_group && !inline_) in_flight_slots_.release();
    return m;
  }

  /// Stops the graph: no new batches are planned, work in flight is cancelled, and the
  /// call returns when every graph task has finished.
  void stop() {
    if (!graph_) return;
    stopping_.store(true);
    arena_.execute([&] {
      graph_->cancel();
      graph_->wait_for_all();
    });
    // Nodes before the graph (their destructors touch it).
    sink_.reset();
    order_.reset();
    work_.reset();
    gate_.reset();
    plan_queue_.reset();
    limiter_.reset();
    input_.reset();
    graph_.reset();
  }

 private:
  std::size_t in_flight_target() const {
    return depth_.load(std::memory_order_relaxed) +
           static_cast<std::size_t>(workers_.load(std::memory_order_relaxed));
  }

  /// On the consumer's thread, every autotune interval: feeds the tuner the interval's
  /// counters and applies its setting to the limiters' slots.
  void maybe_tune();

  PlanMsg plan_next(oneapi::tbb::flow_control& fc) {
    if (done_ || stopping_.load()) {
      fc.stop();
      return {};
    }
    return plan_group(next_group_size());
  }

  /// `workers: inline`, on the consumer's thread: plans, assembles and delivers the next
  /// batches to queue_ — what the graph's three nodes do, with no hand-off between threads.
  /// Cheap batches are made a few at a time, as the graph groups them (group_size()), so that
  /// the group's bookkeeping (its timers, messages and the queue's lock) is paid once for
  /// them; at most kInlineGroupMax, whose batches stay in the core's cache until taken.
  void make_inline() {
    PlanMsg m;
    if (done_)
      m.end = true;
    else
      m = plan_group(std::min(next_group_size(), kInlineGroupMax));
    deliver(assemble(m));
  }

  /// The spine's next group of at most `k` plans (the input node's body, or make_inline's).
  PlanMsg plan_group(std::size_t k) {
    StageTimer timer(spine_ns_, spine_items_, &last_plan_end_ns_);
    timer.count = 0;
    const std::int64_t begin_ns = stats_now_ns();
    // Between two plans the spine waited on the in-flight limit.
    if (last_plan_end_ns_ != 0)
      spine_blocked_ns_.fetch_add(static_cast<std::uint64_t>(begin_ns - last_plan_end_ns_),
                                  std::memory_order_relaxed);
    PlanMsg m;
    m.seq = seq_++;
    messages_.fetch_add(1, std::memory_order_relaxed);
    m.plans = std::make_shared<std::vector<BatchPlan>>();
    m.plans->reserve(k);
    try {
      while (m.plans->size() < k) {
        // (A plan's own start is read for its trace spans alone.)
        const std::int64_t plan_begin_ns =
            tracer_ == nullptr || m.plans->empty() ? begin_ns : stats_now_ns();
        if (tracer_ != nullptr) {
          spine_before_.clear();
          for (const auto& n : stats_.nodes()) spine_before_.push_back(n.busy(NodeStage::kSpine));
        }
        // One plan in kSpineSampling has its spine nodes timed (all of them with a trace,
        // whose spans are per plan).
        const std::uint64_t index = planned_.load(std::memory_order_relaxed);
        const SpineSampling sampling(tracer_ != nullptr            ? 1
                                     : index % kSpineSampling == 0 ? kSpineSampling
                                                                   : 0);
        std::optional<BatchPlan> plan = spine_.next();
        if (!plan) {
          m.end = true;
          done_ = true;
          break;
        }
        const std::uint64_t planned = planned_.fetch_add(1, std::memory_order_relaxed) + 1;
        if (tracer_ != nullptr) trace_plan(*plan, plan_begin_ns, planned);
        m.plans->push_back(std::move(*plan));
        ++timer.count;
      }
    } catch (...) {
      try {
        rethrow_with_node(std::current_exception(), "spine");
      } catch (...) {
        m.error = std::current_exception();
      }
      done_ = true;
    }
    if (!spine_events_.empty()) {
      tracer_->add(spine_events_.data(), spine_events_.size());
      spine_events_.clear();
    }
    return m;
  }

  /// Whether the "batches in flight" counter is due at `now`: the spine and the consumer both
  /// move it, and one sample per batch made a third of a trace's events; one per 100 µs is
  /// plenty to read (a 10 kHz track).
  bool counter_due(std::int64_t now) {
    std::int64_t last = last_counter_ns_.load(std::memory_order_relaxed);
    return now - last >= 100'000 &&
           last_counter_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed);
  }

  /// The size of the next group, from the batches' measured cost so far (group_size()).
  std::size_t next_group_size() {
    const std::uint64_t plans = spine_items_.load(std::memory_order_relaxed);
    const std::uint64_t batches = work_items_.load(std::memory_order_relaxed);
    std::size_t k = 1;
    if (plans > 0 && batches > 0) {
      const std::uint64_t per_batch = spine_ns_.load(std::memory_order_relaxed) / plans +
                                      work_ns_.load(std::memory_order_relaxed) / batches;
      k = group_size(per_batch, batch_bytes_.load(std::memory_order_relaxed));
    }
    group_.store(k, std::memory_order_relaxed);
    return k;
  }

  /// A span per spine node for the batch just planned: the node's own time in it. Spine nodes
  /// call each other many times per batch (a pack pulls document by document), so the spans
  /// are each node's summed own time, laid end to end from the plan's start in pipeline order.
  /// The events go to spine_events_, handed to the tracer once per group (the spine is the
  /// serial part: one lock and one cache line from the workers' per group, not per plan).
  void trace_plan(const BatchPlan& plan, std::int64_t begin_ns, std::uint64_t planned);

  GroupMsg assemble(const PlanMsg& m) {
    // With tuned workers, the group holds a gate slot until its batches are made.
    struct Gate {
      Runtime* rt;
      ~Gate() {
        if (rt->auto_workers_) rt->gate_slots_.release();
      }
    } gate{this};
    GroupMsg out;
    out.seq = m.seq;
    out.items = std::make_shared<std::vector<ItemMsg>>();
    std::vector<ItemMsg>& items = *out.items;
    bool failed = false;
    // This group's spans are those appended from here (a map that runs TBB work may nest
    // another group's assembly on this thread: each hands over its own range).
    std::vector<Tracer::Event>& events = worker_events();
    const std::size_t first_event = events.size();
    if (m.plans && !m.plans->empty() && !stopping_.load()) {
      items.reserve(m.plans->size() + 1);
      StageTimer timer(work_ns_, work_items_);
      timer.count = 0;
      for (BatchPlan& plan : *m.plans) {
        if (stopping_.load()) break;
        ItemMsg item;
        try {
          item.batch = assemble_one(std::move(plan));
        } catch (...) {
          item.error = std::current_exception();
          failed = true;
        }
        items.push_back(std::move(item));
        if (failed) break;
        ++timer.count;
      }
      // The group's spans, handed over at once (assemble_one collects them).
      if (events.size() > first_event) {
        tracer_->add(events.data() + first_event, events.size() - first_event);
        events.resize(first_event);
      }
    }
    if (!failed && (m.error || m.end)) {
      ItemMsg tail;
      tail.error = m.error;
      tail.end = m.end;
      items.push_back(std::move(tail));
    }
    if (items.empty()) items.emplace_back();  // nothing to take but the slot
    items.back().last_of_group = true;
    return out;
  }

  /// One batch of a group, with its stages' counts and trace spans.
  std::shared_ptr<Batch> assemble_one(BatchPlan plan);

  /// This worker thread's spans of the group it assembles.
  static std::vector<Tracer::Event>& worker_events() {
    thread_local std::vector<Tracer::Event> events;
    return events;
  }

  void deliver(const GroupMsg& g) {
    auto t0 = Clock::now();
    std::uint64_t batches = 0;
    for (ItemMsg& out : *g.items) {
      if (!out.batch) continue;
      ++batches;
      if (!deliver_.empty() && !stopping_.load()) run_deliver_stages(out);
    }
    {
      std::lock_guard lock(mu_);
      for (ItemMsg& out : *g.items) queue_.push_back(std::move(out));
      groups_ready_.fetch_add(1, std::memory_order_relaxed);
    }
    // Wakes the consumer if it sleeps (take()); a notify with no sleeper makes no system call.
    delivered_.fetch_add(1, std::memory_order_release);
    delivered_.notify_one();
    deliver_ns_ += elapsed_ns(t0);
    deliver_items_ += batches;
  }

  /// Runs the deliver stages on a batch in order (an error names the stage's node).
  void run_deliver_stages(ItemMsg& out);

  Tracer* tracer_;
  NodeStatsTable stats_;  // before spine_: it owns the timers between the spine's nodes
  Spine spine_;
  const bool node_stats_;                 ///< LoaderOptions::node_stats
  const bool inline_;                     ///< `workers: inline`: no graph, take() makes batches
  const bool auto_workers_, auto_depth_;  ///< `auto`: tuned while running
  const int max_workers_;                 ///< the function node's concurrency
  const std::size_t max_depth_;
  /// Workers and depth now (fixed, or the tuner's latest choice; set by the consumer).
  std::atomic<int> workers_;
  std::atomic<std::size_t> depth_;
  LimiterSlots in_flight_slots_, gate_slots_;
  // The tuner and what its last interval started from (consumer's thread only).
  std::optional<Autotuner> tuner_;
  std::int64_t tune_interval_ns_ = 0, tune_last_ns_ = 0;
  std::uint64_t tune_work_ns_ = 0, tune_spine_ns_ = 0, tune_wait_ns_ = 0, tune_taken_ = 0;
  /// The deliver stages (device_copy, ...), in order, with their nodes' counters.
  struct Deliver {
    std::string name;
    std::shared_ptr<DeliverStage> stage;
    NodeCounters* counters = nullptr;
  };
  std::vector<Deliver> deliver_;
  std::unique_ptr<BatchAssembler> assembler_;
  std::vector<NodeCounters*> assembly_nodes_;  ///< per AssemblyTimes stage (null: not counted)
  std::uint16_t in_flight_name_ = 0, consumer_wait_name_ = 0;

  ParallelismLease lease_;
  oneapi::tbb::task_arena arena_;
  std::unique_ptr<flow::graph> graph_;
  std::unique_ptr<flow::input_node<PlanMsg>> input_;
  std::unique_ptr<LimiterSlots::Node> limiter_;
  std::unique_ptr<flow::queue_node<PlanMsg>> plan_queue_;  ///< with tuned workers: before the gate
  std::unique_ptr<LimiterSlots::Node> gate_;  ///< with tuned workers: one slot a worker
  std::unique_ptr<flow::function_node<PlanMsg, GroupMsg>> work_;
  std::unique_ptr<flow::sequencer_node<GroupMsg>> order_;
  std::unique_ptr<flow::function_node<GroupMsg, flow::continue_msg>> sink_;

  // Spine-side (input node, serial).
  std::uint64_t seq_ = 0;
  bool done_ = false;
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  bool restored_ = false;  ///< the spine was restored in place (note_restored)

  std::mutex mu_;
  /// Bumped after every delivery to queue_: the consumer sleeps on it (take()).
  std::atomic<std::uint32_t> delivered_{0};
  std::deque<ItemMsg> queue_;
  /// Groups in queue_ (changed under mu_; read without it for graph_waits_).
  std::atomic<std::size_t> groups_ready_{0};
  // The consumer's own: the batches it took from queue_ at its last refill, and their groups.
  std::deque<ItemMsg> taken_queue_;
  std::size_t taken_groups_ = 0;

  // Stats: written by graph bodies (atomics) and by the consumer under mu_.
  std::atomic<std::uint64_t> spine_items_{0}, spine_ns_{0}, work_items_{0}, work_ns_{0},
      deliver_items_{0}, deliver_ns_{0};
  std::uint64_t consumer_waits_ = 0, consumer_wait_ns_ = 0;
  std::atomic<std::uint64_t> graph_waits_{0};
  std::int64_t start_ns_ = 0;
  // Spine thread only (the input node is serial), except the atomics.
  std::int64_t last_plan_end_ns_ = 0;
  std::vector<std::uint64_t> spine_before_;
  std::vector<Tracer::Event> spine_events_;  ///< the group's spine spans (trace_plan)
  std::atomic<std::uint64_t> spine_blocked_ns_{0}, planned_{0}, taken_{0};
  std::atomic<std::int64_t> last_counter_ns_{0};  ///< counter_due()'s
  std::atomic<std::uint64_t> messages_{0};        ///< seq_, for stats()
  std::atomic<std::size_t> group_{1};             ///< batches in the latest group
  std::atomic<std::uint64_t> batch_bytes_{0};     ///< largest batch so far, in bytes
};

}  // namespace flowstate
