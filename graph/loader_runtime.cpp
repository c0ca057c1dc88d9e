// The longer bodies of Loader::Runtime (graph/loader_runtime.h): its stats, the autotune
// step, the trace's spine spans, one batch's assembly and its device copy. Kept out of the
// header so that it stays readable (and under 600 lines); graph/loader.cpp is the header's
// other includer.
#include "flowstate/graph/loader_runtime.h"

namespace flowstate {

LoaderStats Loader::Runtime::stats() {
  LoaderStats s;
  const std::uint64_t elapsed =
      start_ns_ == 0 ? 0 : static_cast<std::uint64_t>(stats_now_ns() - start_ns_);
  const std::uint64_t spine_ns = spine_ns_.load(), work_ns = work_ns_.load(),
                      deliver_ns = deliver_ns_.load();
  const int workers = workers_.load(std::memory_order_relaxed);
  s.stages = {{"spine", spine_items_.load(), spine_ns, 1},
              {"assemble", work_items_.load(), work_ns, workers},
              {"deliver", deliver_items_.load(), deliver_ns, 1}};
  const std::uint64_t blocked = spine_blocked_ns_.load(std::memory_order_relaxed);
  const auto idle = [&](std::uint64_t busy, int threads) {
    const std::uint64_t total = elapsed * static_cast<std::uint64_t>(threads);
    return total > busy ? total - busy : 0;
  };
  for (const auto& c : stats_.nodes()) {
    LoaderStats::Node n;
    n.name = c.name;
    n.type = c.type;
    n.stage = node_stage_name(c.stage);
    n.threads = c.stage == NodeStage::kAssemble ? workers : 1;
    n.calls = c.calls.load(std::memory_order_relaxed);
    n.items = c.items.load(std::memory_order_relaxed);
    n.bytes = c.bytes.load(std::memory_order_relaxed);
    n.spine_ns = c.busy(NodeStage::kSpine);
    n.assemble_ns = c.busy(NodeStage::kAssemble);
    n.deliver_ns = c.busy(NodeStage::kDeliver);
    n.busy_ns = n.spine_ns + n.assemble_ns + n.deliver_ns;
    switch (c.stage) {
      case NodeStage::kSpine:
        n.wait_input_ns = c.upstream_ns.load(std::memory_order_relaxed);
        n.wait_output_ns = blocked;
        break;
      case NodeStage::kAssemble:
        n.wait_input_ns = idle(work_ns, workers);
        break;
      case NodeStage::kDeliver:
        n.wait_input_ns = idle(deliver_ns, 1);
        break;
    }
    s.nodes.push_back(std::move(n));
  }
  s.elapsed_ns = elapsed;
  const std::uint64_t planned = planned_.load(std::memory_order_relaxed);
  const std::uint64_t taken = taken_.load(std::memory_order_relaxed);
  s.in_flight = planned > taken ? static_cast<std::size_t>(planned - taken) : 0;
  std::lock_guard lock(mu_);
  s.consumer_waits = consumer_waits_;
  s.consumer_wait_ns = consumer_wait_ns_;
  s.graph_waits = graph_waits_.load(std::memory_order_relaxed);
  s.in_flight_limit = in_flight_target();
  s.messages = messages_.load(std::memory_order_relaxed);
  s.workers = workers;
  s.prefetch_depth = depth_.load(std::memory_order_relaxed);
  s.workers_auto = auto_workers_;
  s.workers_inline = inline_;
  s.prefetch_auto = auto_depth_;
  if (tuner_) {
    s.memory_budget = tuner_->limits().memory_budget;
    s.autotune_changes = tuner_->changes();
  }
  return s;
}

void Loader::Runtime::maybe_tune() {
  const std::int64_t now = stats_now_ns();
  const std::uint64_t work_ns = work_ns_.load(), spine_ns = spine_ns_.load();
  const std::uint64_t taken = taken_.load(std::memory_order_relaxed);
  std::uint64_t wait_ns = 0;
  {
    std::lock_guard lock(mu_);
    wait_ns = consumer_wait_ns_;
  }
  if (tune_last_ns_ == 0 || now - tune_last_ns_ >= tune_interval_ns_) {
    if (tune_last_ns_ != 0) {
      const auto dt = static_cast<double>(now - tune_last_ns_);
      AutotuneSample s;
      s.seconds = dt * 1e-9;
      s.batches = taken - tune_taken_;
      // A slot in flight holds a group of batches.
      s.batch_bytes =
          batch_bytes_.load(std::memory_order_relaxed) * group_.load(std::memory_order_relaxed);
      s.assemble_busy = static_cast<double>(work_ns - tune_work_ns_) /
                        (dt * workers_.load(std::memory_order_relaxed));
      s.spine_busy = static_cast<double>(spine_ns - tune_spine_ns_) / dt;
      s.consumer_wait = static_cast<double>(wait_ns - tune_wait_ns_) / dt;
      const AutotuneSetting next = tuner_->update(s);
      if (next.workers != workers_.load(std::memory_order_relaxed)) {
        gate_slots_.set_target(static_cast<std::size_t>(next.workers));
        workers_.store(next.workers, std::memory_order_relaxed);
      }
      depth_.store(next.depth, std::memory_order_relaxed);
      in_flight_slots_.set_target(in_flight_target());
    }
    tune_last_ns_ = now;
    tune_work_ns_ = work_ns;
    tune_spine_ns_ = spine_ns;
    tune_wait_ns_ = wait_ns;
    tune_taken_ = taken;
  }
}

void Loader::Runtime::trace_plan(const BatchPlan& plan, std::int64_t begin_ns,
                                 std::uint64_t planned) {
  std::vector<Tracer::Event>& events = spine_events_;
  std::int64_t at = begin_ns;
  std::size_t i = 0;
  for (const auto& n : stats_.nodes()) {
    const std::uint64_t d = n.busy(NodeStage::kSpine) - spine_before_[i++];
    if (d == 0) continue;
    Tracer::Event e;
    e.ts_ns = at;
    e.dur_ns = static_cast<std::int64_t>(d);
    e.step = static_cast<std::int64_t>(plan.info.step);
    e.epoch = static_cast<std::int64_t>(plan.info.epoch);
    e.track = Tracer::kSpine;
    e.name = n.trace_id;
    e.summed = true;
    events.push_back(e);
    at += e.dur_ns;
  }
  const std::int64_t now = stats_now_ns();
  if (counter_due(now)) {
    Tracer::Event c;
    c.ph = 'C';
    c.ts_ns = now;
    c.name = in_flight_name_;
    c.value = static_cast<double>(planned - taken_.load(std::memory_order_relaxed));
    events.push_back(c);
  }
}

std::shared_ptr<Batch> Loader::Runtime::assemble_one(BatchPlan plan) {
  thread_local AssemblyTimes times;
  const auto step = static_cast<std::int64_t>(plan.info.step);
  const auto epoch = static_cast<std::int64_t>(plan.info.epoch);
  auto batch = std::make_shared<Batch>(
      assembler_->assemble(std::move(plan), node_stats_ ? &times : nullptr));
  std::uint64_t bytes = 0;
  for (const auto& [id, t] : batch->fields) bytes += t.nbytes();
  if (bytes > batch_bytes_.load(std::memory_order_relaxed))
    batch_bytes_.store(bytes, std::memory_order_relaxed);  // a size estimate: races are fine
  const std::uint32_t track = tracer_ != nullptr ? tracer_->worker_track() : 0;
  std::vector<Tracer::Event>& events = worker_events();
  // Stages alternate chunk by chunk: the spans are each stage's summed time in the batch,
  // laid end to end from the batch's start.
  std::int64_t at = times.begin_ns;
  for (std::size_t k = 0; node_stats_ && k < times.stages.size() && k < assembly_nodes_.size();
       ++k) {
    const AssemblyTimes::Stage& st = times.stages[k];
    NodeCounters* node = assembly_nodes_[k];
    if (node == nullptr || (st.items == 0 && st.ns == 0)) continue;
    node->add(NodeStage::kAssemble, st.ns, st.items, st.bytes);
    if (tracer_ != nullptr) {
      Tracer::Event e = {
          at, static_cast<std::int64_t>(st.ns), step, epoch, 0, track, node->trace_id};
      e.summed = true;
      at += e.dur_ns;
      events.push_back(e);
    }
  }
  return batch;
}

void Loader::Runtime::run_deliver_stages(ItemMsg& out) {
  const Deliver* current = nullptr;
  try {
    for (const Deliver& d : deliver_) {
      current = &d;
      const std::int64_t c0 = stats_now_ns();
      const auto step = static_cast<std::int64_t>(out.batch->info.step);
      const auto epoch = static_cast<std::int64_t>(out.batch->info.epoch);
      const std::uint64_t samples = out.batch->info.num_samples;
      out.batch = std::make_shared<Batch>(d.stage->deliver(std::move(*out.batch)));
      const std::int64_t c1 = stats_now_ns();
      if (d.counters != nullptr) {
        std::uint64_t bytes = 0;
        for (const auto& [id, t] : out.batch->fields) bytes += t.nbytes();
        d.counters->add(NodeStage::kDeliver, static_cast<std::uint64_t>(c1 - c0), samples, bytes);
        if (tracer_ != nullptr)
          tracer_->span(Tracer::kDeliver, d.counters->trace_id, c0, c1, step, epoch);
      }
    }
  } catch (...) {
    try {
      rethrow_with_node(std::current_exception(), current != nullptr ? current->name : "");
    } catch (...) {
      out.error = std::current_exception();
      out.batch.reset();
    }
  }
}

}  // namespace flowstate
