#include "flowstate/graph/pipeline.h"

#include "flowstate/core/launcher.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/launcher.h"

namespace flowstate {

std::vector<CanonicalParam> Pipeline::canonical() const {
  std::vector<CanonicalParam> out{{"seed", std::to_string(seed_)}};
  for (const auto& n : nodes_) {
    out.emplace_back(n.name, n.description.type);
    for (const auto& p : n.description.params)
      if (!p.free) out.emplace_back(n.name + "." + p.key, p.value);
  }
  return out;
}

std::string Pipeline::describe() const {
  std::string s =
      "seed: " + std::to_string(seed_) + "\nworkers: " +
      (workers_ == static_cast<int>(kAuto) ? std::string("auto") : std::to_string(workers_)) +
      " (free)\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    s += "[" + std::to_string(i) + "] " + n.name + ": " + n.description.type + "\n";
    for (const auto& p : n.description.params)
      s += "      " + p.key + ": " + p.value + (p.free ? " (free)" : "") + "\n";
  }
  return s;
}

namespace {

/// Writes each warning to stderr once per process: a job that rebuilds its pipeline (every
/// restore, every test) says it once, not every time.
void say_warnings(const std::vector<std::string>& warnings) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard lock(mu);
  for (const auto& w : warnings)
    if (said.insert(w).second) std::cerr << "flowstate: warning: " << w << '\n';
}

}  // namespace

Pipeline::Builder& Pipeline::Builder::seed(std::uint64_t seed) {
  p_.seed_ = seed;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::workers(int workers) {
  if (workers < 0 || (workers < 1 && workers != static_cast<int>(kAuto)))
    throw ConfigError("workers", "workers must be at least 1 (or kAuto)");
  p_.workers_ = workers;
  return *this;
}

std::string Pipeline::Builder::unique_name(const std::string& base) {
  std::string name = base;
  if (taken_.count(name) != 0) {
    int& k = next_suffix_.try_emplace(base, 2).first->second;
    do {
      name = base + "#" + std::to_string(k++);
    } while (taken_.count(name) != 0);
  }
  taken_.insert(name);
  return name;
}

Pipeline::Builder& Pipeline::Builder::add(const NodeDef& def, std::any options,
                                          std::vector<Pipeline> inputs) {
  if (&def == &shard_node()) {
    // After batch, a shard cuts global batches (the elastic layout): see nodes/shard.h.
    auto& shard = std::any_cast<ShardOptions&>(options);
    shard.after_batch = std::any_of(p_.nodes_.begin(), p_.nodes_.end(),
                                    [](const NodeSpec& s) { return s.phase() == Phase::kBatch; });
  }
  if (def.resolve) options = def.resolve(options);
  NodeSpec n;
  n.name = unique_name(def.base_name ? def.base_name(options) : def.type);
  if (def.validate) def.validate(options, n.name);
  n.def = &def;
  n.description = def.describe(options);
  if (def.workers) n.workers = def.workers(options);
  if (!inputs.empty()) n.inputs = std::make_shared<const std::vector<Pipeline>>(std::move(inputs));
  if (def.warnings)
    for (auto& w : def.warnings(options)) p_.warnings_.push_back(n.name + ": " + std::move(w));
  n.options = std::make_shared<const std::any>(std::move(options));
  p_.nodes_.push_back(std::move(n));
  return *this;
}

Pipeline::Builder& Pipeline::Builder::source(NodeDescription description, SourceFactory factory) {
  return source(SourceSpec{.description = std::move(description), .factory = std::move(factory)});
}

Pipeline::Builder& Pipeline::Builder::source(SourceSpec spec) {
  std::vector<std::string> warnings = std::move(spec.warnings);
  spec.warnings.clear();
  add(source_node(), std::move(spec));
  for (auto& w : warnings) p_.warnings_.push_back(p_.nodes_.back().name + ": " + std::move(w));
  return *this;
}

Pipeline::Builder& Pipeline::Builder::mix(std::vector<Pipeline> inputs, MixOptions options) {
  options.inputs.clear();
  for (const auto& in : inputs) {
    std::string d;
    for (const auto& [k, v] : in.canonical()) d += (d.empty() ? "" : "; ") + k + "=" + v;
    options.inputs.push_back("{" + d + "}");
  }
  return add(mix_node(), std::move(options), std::move(inputs));
}

Pipeline::Builder& Pipeline::Builder::map(SampleFn fn, MapOptions options) {
  options.fn = std::move(fn);
  options.batch_fn = nullptr;
  return add(map_node(), std::move(options));
}

Pipeline::Builder& Pipeline::Builder::map_batch(BatchFn fn, MapOptions options) {
  options.batch_fn = std::move(fn);
  options.fn = nullptr;
  return add(batch_map_node(), std::move(options));
}

Pipeline::Builder& Pipeline::Builder::filter(FilterFn fn, FilterOptions options) {
  options.fn = std::move(fn);
  return add(filter_node(), std::move(options));
}

void Pipeline::Builder::check_order() const {
  const auto& nodes = p_.nodes_;
  if (nodes.empty() || nodes.front().phase() != Phase::kSource)
    throw ConfigError("source", "a pipeline starts with a source");
  int sources = 0;
  Phase last = Phase::kSource;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const NodeSpec& n = nodes[i];
    const Phase ph = n.phase();
    sources += ph == Phase::kSource;
    if (const auto* shard = n.options_as<ShardOptions>(); shard && shard->after_batch) {
      // The elastic layout: the shard cuts what batch makes, before any batch map.
      if (nodes[i - 1].phase() != Phase::kBatch)
        throw ConfigError(n.name, "'" + n.name +
                                      "' after batch must follow it directly (it cuts each "
                                      "global batch into world slices)");
      continue;
    }
    if (ph < last) {
      std::string why = ph == Phase::kSpine
                            ? "must come before any map, filter or pack and before batch"
                        : ph == Phase::kPerSample ? "must come before batch"
                        : ph == Phase::kSource    ? "(a source) must come first"
                                                  : "is out of order";
      throw ConfigError(n.name, "'" + n.name + "' " + why);
    }
    last = ph;
  }
  if (sources != 1) throw ConfigError("source", "a pipeline has exactly one source");
}

Pipeline Pipeline::Builder::build() const {
  check_order();
  const auto& nodes = p_.nodes_;
  int batches = 0, copies = 0;
  for (const auto& n : nodes) {
    batches += n.phase() == Phase::kBatch;
    copies += n.def == &device_copy_node();
  }
  if (batches != 1) throw ConfigError("batch", "a pipeline needs exactly one batch node");
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    const auto* shard = nodes[i].options_as<ShardOptions>();
    if (shard == nullptr || !shard->after_batch) continue;
    const auto& batch = *nodes[i - 1].options_as<BatchOptions>();
    const std::string& name = nodes[i].name;
    if (batch.size % *shard->world != 0)
      throw ConfigError(name + ".world", "'" + name + "' after batch cuts each global batch of " +
                                             std::to_string(batch.size) +
                                             " samples into world slices, but world " +
                                             std::to_string(*shard->world) + " does not divide " +
                                             std::to_string(batch.size) + " (batch.size)");
    if (shard->uneven == ShardUneven::kDrop && !batch.drop_last)
      throw ConfigError(name + ".uneven",
                        "'" + name +
                            "' after batch with uneven: drop needs batch.drop_last: true (a "
                            "short last global batch cannot be cut equally without repeating "
                            "samples; use uneven: pad to repeat them)");
  }
  if (copies > 1) throw ConfigError("device_copy", "at most one device_copy");
  if (copies == 1 && nodes.back().def != &device_copy_node())
    throw ConfigError("device_copy", "device_copy must be the last node");
  Pipeline p = p_;
  // Under a launcher of many ranks, a pipeline that splits nothing feeds every rank all the
  // data: said once (a mix's inputs may hold the shard, so a mix is taken as splitting).
  const bool splits = std::ranges::any_of(nodes, [](const auto& n) {
    return n.template options_as<ShardOptions>() != nullptr || n.def == &mix_node();
  });
  std::optional<std::uint64_t> world;
  try {
    world = launch_env().world;
  } catch (const ConfigError&) {
    // A malformed variable is shard's (or `flowstate run`'s) error to report, not this hint's.
  }
  if (!splits && world && *world > 1)
    p.warnings_.push_back("the launcher says world size " + std::to_string(*world) +
                          " but the pipeline has no shard node: every rank reads all the data "
                          "(add `shard: {}`, or flowstate.DataLoader shards by itself)");
  say_warnings(p.warnings_);
  return p;
}

Pipeline Pipeline::Builder::build_input() const {
  check_order();
  for (const auto& n : p_.nodes_) {
    // An input's Refs reach the mix as its own: no node may replace them (pack, mix).
    const bool keeps_refs = n.def != &pack_node() && n.def != &mix_node();
    if ((n.phase() == Phase::kSource && n.def != &mix_node()) || (n.phase() == Phase::kSpine) ||
        (n.phase() == Phase::kPerSample && keeps_refs))
      continue;
    throw ConfigError(n.name, "'" + n.name +
                                  "' cannot be part of a mix input: an input is a source with "
                                  "shard, shuffle, filter and per-sample maps");
  }
  say_warnings(p_.warnings_);
  return p_;
}

}  // namespace flowstate
