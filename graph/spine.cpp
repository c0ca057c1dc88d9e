#include "flowstate/graph/spine.h"

#include <oneapi/tbb/parallel_for.h>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/nodes/batch.h"

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
  ChainContext(const Pipeline& pipeline, std::uint32_t source_id, Chain& chain, SinkConfig* sink)
      : pipeline_(pipeline), source_id_(source_id), chain_(chain), sink_(sink) {}

  void build(std::size_t index, const NodeSpec& spec) {
    index_ = index;
    spec_ = &spec;
    spec.def->build(*this, *spec.options);
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
    chain_.readers.push_back(
        std::make_unique<MappedReader>(chain_.store, chain_.store_name, chain_.stages));
    return chain_.readers.back().get();
  }
  const ParallelFor& parallel_for() const override { return runtime_parallel_for(); }

  void add(std::unique_ptr<SpineNode> node) override {
    node->connect(chain_.nodes.empty() ? nullptr : chain_.nodes.back().get());
    chain_.nodes.push_back(std::move(node));
  }
  void add_store(std::unique_ptr<SpineNode> node, const RecordStore* store) override {
    add(std::move(node));
    chain_.store = store;
    chain_.store_name = spec_->name;
    chain_.stages.clear();  // later maps work on this store's records
  }
  void add_sample_map(SampleFn fn) override {
    chain_.stages.push_back({spec_->name, map_key(), std::move(fn)});
  }
  void add_batch_map(BatchFn fn) override {
    sink().batch_stages.push_back({spec_->name, map_key(), std::move(fn)});
  }
  void set_batch(BatchOptions options) override {
    sink().batch = std::move(options);
    sink().batch_name = spec_->name;
  }
  void set_user_collate(UserCollateFn fn) override {
    if (sink_ != nullptr) sink_->user_collate = std::move(fn);
  }
  void set_prefetch(std::size_t depth) override { sink().prefetch = depth; }
  void set_device(DeviceCopyOptions options) override { sink().device = std::move(options); }
  std::size_t inputs() const override { return spec_->inputs ? spec_->inputs->size() : 0; }
  Chain build_input(std::size_t i) override {
    if (i >= inputs()) throw Error("node '" + spec_->name + "' has no input " + std::to_string(i));
    return Spine::build_chain((*spec_->inputs)[i], static_cast<std::uint32_t>(i), nullptr);
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
  std::size_t index_ = 0;
  const NodeSpec* spec_ = nullptr;
};

}  // namespace

Chain Spine::build_chain(const Pipeline& pipeline, std::uint32_t source_id, SinkConfig* sink) {
  Chain c;
  ChainContext ctx(pipeline, source_id, c, sink);
  const auto& specs = pipeline.nodes();
  for (std::size_t i = 0; i < specs.size(); ++i) ctx.build(i, specs[i]);
  return c;
}

Spine::Spine(const Pipeline& pipeline, std::uint64_t epochs) {
  chain_ = build_chain(pipeline, 0, &sink_);
  BatchOptions options = sink_.batch;
  if (!options.user_collate) options.user_collate = sink_.user_collate;
  auto planner = std::make_unique<BatchPlanner>(sink_.batch_name, options);
  planner_ = planner.get();
  planner->connect(chain_.nodes.back().get());
  chain_.nodes.push_back(std::move(planner));
  planner_->set_epochs(epochs);
  planner_->set_store(chain_.store);
  planner_->set_snapshotter([this] { return snapshot(); });
}

std::optional<BatchPlan> Spine::next() {
  return planner_->next();  // stamped by the planner, before it looks ahead
}

Stamp Spine::snapshot() const { return snapshot_nodes(chain_.nodes); }

void Spine::restore(std::string_view bytes) { restore_nodes(chain_.nodes, bytes, "state"); }

}  // namespace flowstate
