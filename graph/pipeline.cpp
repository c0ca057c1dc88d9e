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

std::vector<std::string> Pipeline::data_params() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    for (const auto& p : n.description.params) {
      if (!p.data) continue;
      std::string key = n.name + "." + p.key.substr(0, p.key.find('['));
      if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(std::move(key));
    }
  return out;
}

std::string Pipeline::describe() const {
  std::string s = "seed: " + std::to_string(seed_) + "\nworkers: " +
                  (workers_ == static_cast<int>(kAuto)     ? std::string("auto")
                   : workers_ == static_cast<int>(kInline) ? std::string("inline")
                                                           : std::to_string(workers_)) +
                  " (free)\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    s += '[';
    s += std::to_string(i) + "] " + n.name + ": " + n.description.type + "\n";
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
  if (!is_workers_setting(workers))
    throw ConfigError("workers", "workers must be at least 1 (or kAuto, or kInline)");
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
  const Position where{
      .after_batch = std::any_of(p_.nodes_.begin(), p_.nodes_.end(),
                                 [](const NodeSpec& s) { return s.phase() == Phase::kBatch; })};
  if (def.resolve) options = def.resolve(options, where);
  NodeSpec n;
  n.name = unique_name(def.base_name ? def.base_name(options) : def.type);
  if (def.validate) def.validate(options, n.name);
  n.def = &def;
  n.description = def.describe(options);
  if (def.workers) n.workers = def.workers(options);
  if (def.place) {
    std::tie(n.node_phase, n.placement) = def.place(options);
  } else {
    n.node_phase = def.phase;
    n.placement = def.placement;
  }
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

std::vector<std::string> Pipeline::Builder::describe_inputs(const std::vector<Pipeline>& inputs) {
  std::vector<std::string> out;
  for (const auto& in : inputs) {
    std::string d;
    for (const auto& [k, v] : in.canonical()) d += (d.empty() ? "" : "; ") + k + "=" + v;
    out.push_back("{" + d + "}");
  }
  return out;
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
    if (n.placement.directly_after_batch) {
      if (nodes[i - 1].phase() != Phase::kBatch)
        throw ConfigError(
            n.name, "'" + n.name + "' after batch must follow it directly" +
                        (n.placement.why.empty() ? std::string()
                                                 : " (" + std::string(n.placement.why) + ")"));
      last = ph;
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

void Pipeline::Builder::check_placement(const PlacementWords& words) const {
  const auto& nodes = p_.nodes_;
  const auto refer = [&](std::size_t i) {
    return words.node ? words.node(i) : "'" + nodes[i].name + "'";
  };
  // The runtime plans batches with one node of Phase::kBatch; unique nodes by definition.
  std::optional<std::size_t> batch;
  std::vector<std::pair<const NodeDef*, std::size_t>> seen;  // definition, first index
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const NodeSpec& n = nodes[i];
    if (n.phase() == Phase::kBatch) {
      if (batch)
        throw ConfigError(
            n.name, "a pipeline has exactly one batch node, and " + refer(*batch) + " is one");
      batch = i;
    }
    if (n.placement.unique) {
      auto it =
          std::find_if(seen.begin(), seen.end(), [&](const auto& s) { return s.first == n.def; });
      if (it != seen.end())
        throw ConfigError(n.name, "a pipeline has at most one " + n.def->type + ", and " +
                                      refer(it->second) + " is one");
      seen.emplace_back(n.def, i);
    }
    if (n.placement.last && i + 1 != nodes.size())
      throw ConfigError(n.name, n.def->type + " must be the last node");
  }
  if (!batch && !words.mix_input)
    throw ConfigError("batch", words.missing_batch ? words.missing_batch()
                                                   : "a pipeline needs exactly one batch node");
}

void Pipeline::Builder::run_checks() const {
  const auto& nodes = p_.nodes_;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].def->check) nodes[i].def->check(nodes, i);
}

Pipeline Pipeline::Builder::build(const PlacementWords& words) const {
  check_placement(words);
  check_order();
  run_checks();
  Pipeline p = p_;
  // Under a launcher of many ranks, a pipeline that splits nothing feeds every rank all the
  // data: said once.
  std::optional<std::uint64_t> world;
  try {
    world = launch_env().world;
  } catch (const ConfigError&) {
    // A malformed variable is shard's (or `flowstate run`'s) error to report, not this hint's.
  }
  if (!p.splits_ranks() && world && *world > 1)
    p.warnings_.push_back("the launcher says world size " + std::to_string(*world) +
                          " but the pipeline has no shard node: every rank reads all the data "
                          "(add `shard: {}`, or flowstate.DataLoader shards by itself)");
  say_warnings(p.warnings_);
  return p;
}

Pipeline Pipeline::Builder::build_input(const PlacementWords& words) const {
  check_order();
  for (const auto& n : p_.nodes_) {
    // An input's Refs reach the mix as its own: no node may replace them (pack, mix), and
    // nothing from batch on belongs to an input.
    if (n.placement.in_mix_input && n.phase() < Phase::kBatch) continue;
    throw ConfigError(n.name, "'" + n.name +
                                  "' cannot be part of a mix input: an input is a source with "
                                  "shard, shuffle, filter and per-sample maps");
  }
  PlacementWords w = words;
  w.mix_input = true;
  check_placement(w);
  run_checks();
  say_warnings(p_.warnings_);
  return p_;
}

bool Pipeline::splits_ranks() const {
  return std::ranges::any_of(nodes_, [](const NodeSpec& n) {
    if (n.def->splits_ranks) return true;
    return n.inputs &&
           std::ranges::any_of(*n.inputs, [](const Pipeline& in) { return in.splits_ranks(); });
  });
}

void Pipeline::check_launch(std::uint64_t rank, std::uint64_t world) const {
  for (const auto& n : nodes_) {
    if (n.def->check_launch) n.def->check_launch(*n.options, n.name, rank, world);
    if (n.inputs)
      for (const auto& in : *n.inputs) in.check_launch(rank, world);
  }
}

std::vector<std::string> Pipeline::host_overrides() const {
  std::vector<std::string> out;
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    const NodeSpec& n = nodes_[i];
    if (!n.def->on_host) continue;
    // nodes()[0] is the source; YAML's nodes[] starts after it.
    if (auto set = n.def->on_host(*n.options))
      out.push_back("nodes[" + std::to_string(i - 1) + "]." + n.def->type + "." + *set);
  }
  return out;
}

}  // namespace flowstate
