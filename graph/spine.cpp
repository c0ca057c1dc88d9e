#include "graph/spine.h"

#include <sstream>

#include <cereal/types/string.hpp>

#include "core/error.h"
#include "core/hash.h"
#include "nodes/batch.h"

namespace flowstate {

std::uint64_t node_key(std::uint64_t seed, std::size_t index, std::string_view type) {
  return hash_combine(hash_combine(seed, index), hash64(type));
}

namespace {

/// Pack rows carry a source id of their own, out of the way of sources and mix inputs.
constexpr std::uint32_t kPackSourceBase = 0x80000000u;

}  // namespace

Spine::Chain Spine::build_chain(const Pipeline& pipeline, std::uint32_t source_id) {
  using K = NodeSpec::Kind;
  Chain c;
  const auto& specs = pipeline.nodes();
  auto append = [&](std::unique_ptr<SpineNode> node) {
    node->connect(c.nodes.empty() ? nullptr : c.nodes.back().get());
    c.nodes.push_back(std::move(node));
  };
  auto reader = [&]() -> const SampleReader* {
    c.readers.push_back(std::make_unique<MappedReader>(c.store, c.store_name, c.stages));
    return c.readers.back().get();
  };
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const NodeSpec& spec = specs[i];
    const std::uint64_t key = node_key(pipeline.seed(), i, spec.description.type);
    switch (spec.kind) {
      case K::kSource: {
        SourceParts parts = spec.make_source(spec.name, source_id);
        c.store = parts.store;
        c.store_name = spec.name;
        append(std::move(parts.node));
        break;
      }
      case K::kMix: {
        std::vector<MixInput> inputs;
        for (std::size_t j = 0; j < spec.mix_inputs->size(); ++j) {
          Chain sub = build_chain((*spec.mix_inputs)[j], static_cast<std::uint32_t>(j));
          MixInput in;
          in.name = "input " + std::to_string(j);
          in.nodes = std::move(sub.nodes);
          in.own = std::move(sub.readers);
          in.store = sub.store;
          in.reader =
              std::make_unique<MappedReader>(sub.store, sub.store_name, std::move(sub.stages));
          inputs.push_back(std::move(in));
        }
        auto mix = std::make_unique<MixNode>(spec.name, spec.mix, key, std::move(inputs));
        c.store = mix.get();
        c.store_name = spec.name;
        append(std::move(mix));
        break;
      }
      case K::kSpine:
        append(spec.make_spine(spec.name, key));
        break;
      case K::kSampleMap:
        // The key of a map's generator predates node_key; kept so outputs stay the same.
        c.stages.push_back({spec.name, hash_combine(pipeline.seed(), i), spec.sample_fn});
        break;
      case K::kFilter:
        append(std::make_unique<FilterNode>(spec.name, spec.filter_fn, key, reader(), c.store));
        break;
      case K::kPack: {
        auto pack = std::make_unique<PackNode>(spec.name, spec.pack, reader(), c.store,
                                               kPackSourceBase + static_cast<std::uint32_t>(i));
        c.store = pack.get();
        c.store_name = spec.name;
        c.stages.clear();  // later maps work on rows
        append(std::move(pack));
        break;
      }
      default:
        return c;  // batch and what follows it are not part of the spine
    }
  }
  return c;
}

Spine::Spine(const Pipeline& pipeline, std::uint64_t epochs) {
  chain_ = build_chain(pipeline, 0);
  for (const auto& spec : pipeline.nodes()) {
    if (spec.kind != NodeSpec::Kind::kBatch) continue;
    BatchOptions options = spec.batch;
    if (!options.user_collate) options.user_collate = pipeline.nodes().front().user_collate;
    auto planner = std::make_unique<BatchPlanner>(spec.name, options);
    planner_ = planner.get();
    planner->connect(chain_.nodes.back().get());
    chain_.nodes.push_back(std::move(planner));
  }
  planner_->set_epochs(epochs);
  planner_->set_store(chain_.store);
  planner_->set_snapshotter([this] { return snapshot(); });
}

std::optional<BatchPlan> Spine::next() {
  return planner_->next();  // stamped by the planner, before it looks ahead
}

Stamp Spine::snapshot() const {
  auto s = std::make_shared<StampData>();
  s->node_names.reserve(chain_.nodes.size());
  s->snapshots.reserve(chain_.nodes.size());
  for (const auto& n : chain_.nodes) {
    s->node_names.push_back(n->name());
    s->snapshots.push_back(n->snapshot());
  }
  return s;
}

void Spine::restore(std::string_view bytes) {
  std::istringstream is{std::string(bytes), std::ios::binary};
  try {
    InArchive ar(is);
    StateReadLimit limit(bytes.size());
    std::uint32_t count = 0;
    ar(count);
    if (count != chain_.nodes.size())
      throw CheckpointError("state", "the state holds " + std::to_string(count) +
                                         " stateful nodes, this pipeline has " +
                                         std::to_string(chain_.nodes.size()));
    for (const auto& n : chain_.nodes) {
      std::string name;
      load_bounded(ar, name);
      if (name != n->name())
        throw CheckpointError("state", "the state holds node '" + name +
                                           "' where this pipeline has '" + n->name() + "'");
      n->restore(ar);
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError("state",
                          std::string("node states are truncated or corrupt: ") + e.what());
  }
}

}  // namespace flowstate
