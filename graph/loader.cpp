#include "flowstate/graph/loader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/spine.h"

namespace flowstate {

namespace flow = oneapi::tbb::flow;

namespace {

using Clock = std::chrono::steady_clock;
std::uint64_t elapsed_ns(Clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

/// A planned batch travelling through the graph, or the end marker, or a spine error.
struct PlanMsg {
  std::uint64_t seq = 0;
  std::shared_ptr<BatchPlan> plan;  // shared_ptr: TBB buffers copy messages
  std::exception_ptr error;
  bool end = false;
};

/// A finished batch (or end / error) in sequence order.
struct ItemMsg {
  std::uint64_t seq = 0;
  std::shared_ptr<Batch> batch;
  std::exception_ptr error;
  bool end = false;
};

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

int assembly_workers(const Pipeline& p, const LoaderOptions& o) {
  if (o.workers) return std::max(1, *o.workers);
  int w = p.workers();
  for (const auto& n : p.nodes())
    if (n.workers) w = std::max(w, *n.workers);
  return w;
}

std::size_t prefetch_depth(const Spine& spine, const LoaderOptions& o) {
  if (o.prefetch) return std::max<std::size_t>(1, *o.prefetch);
  return spine.sink().prefetch.value_or(2);
}

}  // namespace

/// One running instance of the graph: spine, TBB nodes and the consumer queue.
class Loader::Runtime {
 public:
  Runtime(const Pipeline& pipeline, const LoaderOptions& options)
      : spine_(pipeline, options.epochs),
        workers_(assembly_workers(pipeline, options)),
        depth_(prefetch_depth(spine_, options)),
        // Enough TBB threads for the workers plus the serial input and output nodes, also on
        // small machines where the default pool would starve the graph.
        lease_(static_cast<std::size_t>(workers_) + 2),
        arena_(workers_ + 1, 0) {
    const SinkConfig& sink = spine_.sink();
    if (sink.device) device_ = std::make_unique<DeviceCopy>(*sink.device);
    auto pool = device_ ? device_->staging_pool() : BufferPool::host();
    assembler_ = std::make_unique<BatchAssembler>(
        spine_.store(), spine_.source_name(), spine_.planner().options(), spine_.sample_stages(),
        sink.batch_stages, std::move(pool));
  }

  ~Runtime() { stop(); }

  Spine& spine() { return spine_; }

  /// Builds and starts the graph. The spine must be in its starting state.
  void start() {
    arena_.execute([&] {
      graph_ = std::make_unique<flow::graph>();
      input_ = std::make_unique<flow::input_node<PlanMsg>>(
          *graph_, [this](oneapi::tbb::flow_control& fc) { return plan_next(fc); });
      // Slots: batches being assembled, waiting for order, and waiting for the consumer.
      limiter_ = std::make_unique<flow::limiter_node<PlanMsg>>(*graph_, depth_ + workers_);
      work_ = std::make_unique<flow::function_node<PlanMsg, ItemMsg>>(
          *graph_, static_cast<std::size_t>(workers_),
          [this](const PlanMsg& m) { return assemble(m); });
      order_ = std::make_unique<flow::sequencer_node<ItemMsg>>(
          *graph_, [](const ItemMsg& m) { return static_cast<std::size_t>(m.seq); });
      sink_ = std::make_unique<flow::function_node<ItemMsg, flow::continue_msg>>(
          *graph_, flow::serial, [this](const ItemMsg& m) {
            deliver(m);
            return flow::continue_msg();
          });
      flow::make_edge(*input_, *limiter_);
      flow::make_edge(*limiter_, *work_);
      flow::make_edge(*work_, *order_);
      flow::make_edge(*order_, *sink_);
      input_->activate();
    });
    started_ = true;
  }

  bool started() const { return started_; }

  LoaderStats stats() {
    LoaderStats s;
    std::lock_guard lock(mu_);
    s.stages = {{"spine", spine_items_.load(), spine_ns_.load(), 1},
                {"assemble", work_items_.load(), work_ns_.load(), workers_},
                {"deliver", deliver_items_.load(), deliver_ns_.load(), 1}};
    s.consumer_waits = consumer_waits_;
    s.consumer_wait_ns = consumer_wait_ns_;
    s.graph_waits = graph_waits_;
    s.in_flight_limit = depth_ + static_cast<std::size_t>(workers_);
    return s;
  }

  /// Blocks until the next item in sequence order is ready and releases its limiter slot.
  ItemMsg take() {
    ItemMsg m;
    {
      std::unique_lock lock(mu_);
      if (queue_.empty()) {
        ++consumer_waits_;
        auto t0 = Clock::now();
        ready_.wait(lock, [&] { return !queue_.empty(); });
        consumer_wait_ns_ += elapsed_ns(t0);
      } else if (queue_.size() >= depth_ + static_cast<std::size_t>(workers_)) {
        ++graph_waits_;
      }
      m = std::move(queue_.front());
      queue_.pop_front();
    }
    // Not through arena_.execute: an external thread that finds every arena slot busy would
    // wait for a worker to run the call. A try_put from outside submits its task to the
    // graph's arena and returns.
    limiter_->decrementer().try_put(flow::continue_msg());
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
    limiter_.reset();
    input_.reset();
    graph_.reset();
  }

 private:
  PlanMsg plan_next(oneapi::tbb::flow_control& fc) {
    if (done_ || stopping_.load()) {
      fc.stop();
      return {};
    }
    auto t0 = Clock::now();
    struct Count {
      Runtime* rt;
      Clock::time_point t0;
      ~Count() {
        rt->spine_ns_ += elapsed_ns(t0);
        ++rt->spine_items_;
      }
    } count{this, t0};
    PlanMsg m;
    m.seq = seq_++;
    try {
      std::optional<BatchPlan> plan = spine_.next();
      if (plan) {
        m.plan = std::make_shared<BatchPlan>(std::move(*plan));
      } else {
        m.end = true;
        done_ = true;
      }
    } catch (...) {
      try {
        rethrow_with_node(std::current_exception(), "spine");
      } catch (...) {
        m.error = std::current_exception();
      }
      done_ = true;
    }
    return m;
  }

  ItemMsg assemble(const PlanMsg& m) {
    ItemMsg out;
    out.seq = m.seq;
    out.end = m.end;
    out.error = m.error;
    if (!m.plan || stopping_.load()) return out;
    auto t0 = Clock::now();
    struct Count {
      Runtime* rt;
      Clock::time_point t0;
      ~Count() {
        rt->work_ns_ += elapsed_ns(t0);
        ++rt->work_items_;
      }
    } count{this, t0};
    try {
      out.batch = std::make_shared<Batch>(assembler_->assemble(std::move(*m.plan)));
    } catch (...) {
      out.error = std::current_exception();
    }
    return out;
  }

  void deliver(const ItemMsg& m) {
    auto t0 = Clock::now();
    ItemMsg out = m;
    if (device_ && out.batch && !stopping_.load()) {
      try {
        out.batch = std::make_shared<Batch>(device_->copy(std::move(*out.batch)));
      } catch (...) {
        try {
          rethrow_with_node(std::current_exception(), "device_copy");
        } catch (...) {
          out.error = std::current_exception();
          out.batch.reset();
        }
      }
    }
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(out));
    }
    ready_.notify_one();
    deliver_ns_ += elapsed_ns(t0);
    ++deliver_items_;
  }

  Spine spine_;
  int workers_;
  std::size_t depth_;
  std::unique_ptr<DeviceCopy> device_;
  std::unique_ptr<BatchAssembler> assembler_;

  ParallelismLease lease_;
  oneapi::tbb::task_arena arena_;
  std::unique_ptr<flow::graph> graph_;
  std::unique_ptr<flow::input_node<PlanMsg>> input_;
  std::unique_ptr<flow::limiter_node<PlanMsg>> limiter_;
  std::unique_ptr<flow::function_node<PlanMsg, ItemMsg>> work_;
  std::unique_ptr<flow::sequencer_node<ItemMsg>> order_;
  std::unique_ptr<flow::function_node<ItemMsg, flow::continue_msg>> sink_;

  // Spine-side (input node, serial).
  std::uint64_t seq_ = 0;
  bool done_ = false;
  std::atomic<bool> stopping_{false};
  bool started_ = false;

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<ItemMsg> queue_;

  // Stats: written by graph bodies (atomics) and by the consumer under mu_.
  std::atomic<std::uint64_t> spine_items_{0}, spine_ns_{0}, work_items_{0}, work_ns_{0},
      deliver_items_{0}, deliver_ns_{0};
  std::uint64_t consumer_waits_ = 0, consumer_wait_ns_ = 0, graph_waits_ = 0;
};

LoaderStats Loader::stats() const { return runtime_->stats(); }

Loader::Loader(Pipeline pipeline, LoaderOptions options)
    : pipeline_(std::move(pipeline)),
      options_(options),
      canonical_(pipeline_.canonical()),
      fingerprint_(fingerprint_of(canonical_)) {
  runtime_ = std::make_unique<Runtime>(pipeline_, options_);
  last_stamp_ = runtime_->spine().snapshot();
}

Loader::~Loader() = default;

std::optional<Batch> Loader::next() {
  if (error_) std::rethrow_exception(error_);
  rethrow_failed_save();
  if (finished_) return std::nullopt;
  if (!runtime_->started()) runtime_->start();
  for (;;) {
    ItemMsg m = runtime_->take();
    if (m.error) {
      error_ = m.error;
      runtime_->stop();
      std::rethrow_exception(error_);
    }
    if (m.end) {
      finished_ = true;
      runtime_->stop();
      return std::nullopt;
    }
    if (!m.batch) continue;  // cancelled work (only while stopping)
    Batch& b = *m.batch;
    if (b.fence) {
      try {
        b.fence->wait();
      } catch (...) {
        try {
          rethrow_with_node(std::current_exception(), "device_copy");
        } catch (...) {
          error_ = std::current_exception();
        }
        runtime_->stop();
        std::rethrow_exception(error_);
      }
      b.fence.reset();
    }
    last_stamp_ = b.stamp;
    last_step_ = b.info.step;
    last_epoch_ = b.info.epoch;
    return std::move(b);
  }
}

PipelineState Loader::state_struct() const {
  PipelineState s = state_struct_without_spine();
  s.spine = serialize_stamp(*last_stamp_);
  return s;
}

PipelineState Loader::state_struct_without_spine() const {
  PipelineState s;
  s.fingerprint = fingerprint_;
  s.canonical = canonical_;
  s.last_step = last_step_;
  s.last_epoch = last_epoch_;
  s.skips = skips_.ranges;
  return s;
}

std::string Loader::state() const { return state_struct().encode(); }

void Loader::rebuild(const PipelineState& state) {
  // Open and restore the new spine first: if that fails, the loader keeps running as before.
  auto rt = std::make_unique<Runtime>(pipeline_, options_);
  rt->spine().restore(state.spine);
  SkipRanges skips{state.skips};
  rt->spine().set_skips(skips);
  runtime_ = std::move(rt);
  skips_ = std::move(skips);
  last_stamp_ = runtime_->spine().snapshot();
  last_step_ = state.last_step;
  last_epoch_ = state.last_epoch;
  error_ = nullptr;
  finished_ = false;
}

void Loader::load_state(std::string_view bytes) {
  PipelineState s = PipelineState::decode(bytes);
  if (s.fingerprint != fingerprint_)
    throw CheckpointError("state", "the state was saved by a pipeline whose output differs:\n" +
                                       describe_mismatch(s.canonical, canonical_));
  rebuild(s);
}

void Loader::skip(std::uint64_t first, std::uint64_t last) {
  if (first > last)
    throw ConfigError("skip", "skip range " + std::to_string(first) + ":" + std::to_string(last) +
                                  " is reversed (first > last)");
  if (last_step_ && first <= *last_step_)
    throw ConfigError("skip", "skip range " + std::to_string(first) + ":" + std::to_string(last) +
                                  " starts at or before step " + std::to_string(*last_step_) +
                                  ", which was already delivered");
  PipelineState s = state_struct();
  SkipRanges skips{s.skips};
  skips.add(first, last);
  s.skips = skips.ranges;
  // Re-plan from the last delivered batch: batches prepared ahead are discarded, so the
  // skip and the is_last_in_epoch marks are exact.
  rebuild(s);
}

}  // namespace flowstate
