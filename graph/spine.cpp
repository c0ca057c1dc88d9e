#include "flowstate/graph/spine.h"

#include <map>

#include <oneapi/tbb/parallel_for.h>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/node_stats.h"
#include "flowstate/nodes/read_plan.h"

namespace flowstate {

std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type) {
  return hash_combine(hash_combine(seed, index), hash64(type));
}

const ParallelFor& runtime_parallel_for() {
  static const ParallelFor f = [](std::size_t n, const std::function<void(std::size_t)>& body) {
    oneapi::tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) { body(i); });
  };
  return f;
}

namespace {

/// Stores made by nodes other than sources (pack's rows) carry a source id of their own, out
/// of the way of sources and mix inputs: this base plus the node's position.
constexpr std::uint32_t kStoreSourceBase = 0x80000000u;

/// The BuildContext of one pipeline's chain: each node's build adds itself through it.
class ChainContext final : public BuildContext {
 public:
  ChainContext(const Pipeline& pipeline, std::uint32_t source_id, Chain& chain, SinkConfig* sink,
               NodeStatsTable* stats, std::string prefix)
      : pipeline_(pipeline),
        source_id_(source_id),
        chain_(chain),
        sink_(sink),
        stats_(stats),
        prefix_(std::move(prefix)) {}

  void build(std::size_t index, const NodeSpec& spec) {
    index_ = index;
    spec_ = &spec;
    counters_ = nullptr;
    if (stats_ != nullptr) {
      const Phase p = spec.phase();
      counters_ = &stats_->add(
          prefix_ + stats_name(spec), spec.description.type,
          p == Phase::kBatch || p == Phase::kPerBatch ? NodeStage::kAssemble : NodeStage::kSpine);
    }
    spec.def->build(*this, *spec.options);
    if (spec.phase() == Phase::kBatch) batch_built_ = true;
  }
  /// The counters of the chain's last node (null without stats).
  NodeCounters* last_counters() const {
    return chain_counters_.empty() ? nullptr : chain_counters_.back();
  }

  const std::string& name() const override { return spec_->name; }
  std::uint64_t key() const override {
    return node_key(pipeline_.seed(), index_, spec_->description.type);
  }
  // The key of a map's generator predates node_key; kept so outputs stay the same.
  std::uint64_t map_key() const override { return hash_combine(pipeline_.seed(), index_); }
  std::uint32_t source_id() const override {
    return spec_->phase() == Phase::kSource ? source_id_
                                            : kStoreSourceBase + static_cast<std::uint32_t>(index_);
  }
  const RecordStore* store() const override { return chain_.store; }
  const SampleReader* reader() override {
    auto reader = std::make_unique<MappedReader>(chain_.store, chain_.store_name, chain_.stages,
                                                 chain_.stages->size());
    // Where the last reader made reads the same store and maps, this one starts from what that
    // one's node passes on (filter after filter: each applies only the maps between them).
    reader->read_after(last_reader_);
    last_reader_ = reader.get();
    chain_.readers.push_back(std::move(reader));
    return chain_.readers.back().get();
  }
  const ParallelFor& parallel_for() const override { return runtime_parallel_for(); }

  void add(std::unique_ptr<SpineNode> node) override {
    SpineNode* upstream = chain_.nodes.empty() ? nullptr : chain_.nodes.back().get();
    if (upstream != nullptr && chain_counters_.back() != nullptr)
      upstream = stats_->timed(upstream, *chain_counters_.back());
    node->connect(upstream);
    chain_.nodes.push_back(std::move(node));
    chain_counters_.push_back(counters_);
  }
  void add_store(std::unique_ptr<SpineNode> node, const RecordStore* store) override {
    add(std::move(node));
    chain_.store = store;
    chain_.store_name = spec_->name;
    // Later maps work on this store's records; readers made before keep the list they share.
    chain_.stages = std::make_shared<std::vector<SampleStage>>();
  }
  void add_sample_map(SampleFn fn) override {
    if (counters_ != nullptr) counters_->stage = NodeStage::kAssemble;
    chain_.stages->push_back({spec_->name, map_key(), std::move(fn)});
  }
  void add_stage(AssemblyStage stage) override {
    if (stage.planner) {
      if (sink().planner || !sink().batch_name.empty())
        throw ConfigError(spec_->name, "'" + spec_->name + "' plans batches, but '" +
                                           sink().batch_name + "' does already");
      sink().planner = std::move(stage.planner);
      sink().batch_name = spec_->name;
    }
    if (stage.plan) {
      if (!batch_built_ && !sink().planner)
        throw ConfigError(spec_->name,
                          "'" + spec_->name + "' rewrites planned batches: it must follow batch");
      sink().plan_stages.push_back({spec_->name, std::move(stage.plan)});
    }
    if (stage.batch)
      sink().batch_stages.push_back({spec_->name, map_key(), std::move(stage.batch)});
    if (stage.deliver) {
      if (counters_ != nullptr) counters_->stage = NodeStage::kDeliver;
      sink().deliver.emplace_back(spec_->name, std::move(stage.deliver));
    }
    if (stage.queue_depth) sink().prefetch = *stage.queue_depth;
  }
  void set_user_collate(UserCollateFn fn) override {
    if (sink_ != nullptr) sink_->user_collate = std::move(fn);
  }
  bool after_batch() const override { return batch_built_; }
  void set_attribute(const std::string& key, std::uint64_t value) override {
    attributes_[key] = value;
  }
  std::optional<std::uint64_t> attribute(const std::string& key) const override {
    auto it = attributes_.find(key);
    if (it == attributes_.end()) return std::nullopt;
    return it->second;
  }
  std::size_t inputs() const override { return spec_->inputs ? spec_->inputs->size() : 0; }
  Chain build_input(std::size_t i) override {
    if (i >= inputs()) throw Error("node '" + spec_->name + "' has no input " + std::to_string(i));
    NodeCounters* last = nullptr;
    Chain c =
        Spine::build_chain((*spec_->inputs)[i], static_cast<std::uint32_t>(i), nullptr, stats_,
                           prefix_ + stats_name(*spec_) + "[" + std::to_string(i) + "]/", &last);
    // The mix pulls the input's last node directly: time those pulls too, as a downstream
    // node's connect() does for every other node.
    if (last != nullptr && !c.nodes.empty()) c.tail = stats_->timed(c.nodes.back().get(), *last);
    return c;
  }

 private:
  SinkConfig& sink() {
    if (sink_ == nullptr)
      throw ConfigError(spec_->name, "'" + spec_->name + "' cannot be part of a mix input");
    return *sink_;
  }

  const Pipeline& pipeline_;
  std::uint32_t source_id_;
  Chain& chain_;
  SinkConfig* sink_;
  NodeStatsTable* stats_;
  std::string prefix_;  ///< "mix[0]/" in a mix's input
  std::size_t index_ = 0;
  const NodeSpec* spec_ = nullptr;
  bool batch_built_ = false;
  std::map<std::string, std::uint64_t> attributes_;
  NodeCounters* counters_ = nullptr;           ///< the node being built's
  std::vector<NodeCounters*> chain_counters_;  ///< of chain_.nodes, in order
  MappedReader* last_reader_ = nullptr;        ///< the last reader() made
};

}  // namespace

Chain Spine::build_chain(const Pipeline& pipeline, std::uint32_t source_id, SinkConfig* sink,
                         NodeStatsTable* stats, const std::string& prefix,
                         NodeCounters** last_counters) {
  Chain c;
  ChainContext ctx(pipeline, source_id, c, sink, stats, prefix);
  const auto& specs = pipeline.nodes();
  for (std::size_t i = 0; i < specs.size(); ++i) ctx.build(i, specs[i]);
  if (last_counters != nullptr) *last_counters = ctx.last_counters();
  return c;
}

Spine::Spine(const Pipeline& pipeline, std::uint64_t epochs, NodeStatsTable* stats) {
  NodeCounters* last = nullptr;
  chain_ = build_chain(pipeline, 0, &sink_, stats, "", &last);
  if (!sink_.planner)
    throw ConfigError("batch", "a pipeline needs exactly one batch node");  // Builder::build
  std::unique_ptr<BatchPlanner> planner = std::move(sink_.planner);
  if (sink_.user_collate && !planner->options().user_collate)
    planner->set_user_collate(sink_.user_collate);
  planner_ = planner.get();
  SpineNode* upstream = chain_.nodes.back().get();
  if (stats != nullptr) {
    if (last != nullptr) upstream = stats->timed(upstream, *last);
    for (const auto& spec : pipeline.nodes())
      if (spec.name == sink_.batch_name) planner_counters_ = stats->find(stats_name(spec));
  }
  planner->connect(upstream);
  chain_.nodes.push_back(std::move(planner));
  planner_->set_epochs(epochs);
  for (auto& stage : sink_.plan_stages) planner_->add_plan_stage(std::move(stage));
  sink_.plan_stages.clear();
  planner_->set_store(chain_.store);
  planner_->set_snapshotter([this] { return snapshot(); });
  // Asked once: a store of local files is no ReadPlanner, or says no, and is never called.
  if (const auto* p = dynamic_cast<const ReadPlanner*>(chain_.store); p && p->plans_reads())
    read_planner_ = p;
}

std::optional<BatchPlan> Spine::next() {
  std::optional<BatchPlan> plan = plan_next();
  // The reads this batch will make, before a worker makes them (not state: a plan is a function
  // of the batch).
  if (read_planner_ != nullptr && plan) read_planner_->plan_reads(plan->info.refs);
  return plan;
}

std::optional<BatchPlan> Spine::plan_next() {
  if (planner_counters_ == nullptr) return planner_->next();
  // The batch node's boundary (its upstreams' are their timing wrappers, graph/node_stats.cpp,
  // there with node stats only): an error the planner itself throws names it.
  try {
    SpineScope scope(*planner_counters_);
    std::optional<BatchPlan> plan =
        planner_->next();  // stamped by the planner, before it looks ahead
    if (plan) scope.set_items(plan->info.refs.size());
    return plan;
  } catch (...) {
    rethrow_with_node(std::current_exception(), sink_.batch_name);
  }
}

Stamp Spine::snapshot() const { return snapshot_nodes(chain_.nodes, &stamps_); }

void Spine::restore(std::string_view bytes, const DataChange* change) {
  restore_nodes(chain_.nodes, bytes, "state", change);
}

}  // namespace flowstate
