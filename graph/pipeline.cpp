#include "graph/pipeline.h"

#include <iostream>
#include <map>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/hash.h"

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
      "seed: " + std::to_string(seed_) + "\nworkers: " + std::to_string(workers_) + " (free)\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& n = nodes_[i];
    s += "[" + std::to_string(i) + "] " + n.name + ": " + n.description.type + "\n";
    for (const auto& p : n.description.params)
      s += "      " + p.key + ": " + p.value + (p.free ? " (free)" : "") + "\n";
  }
  return s;
}

Pipeline::Builder& Pipeline::Builder::seed(std::uint64_t seed) {
  p_.seed_ = seed;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::workers(int workers) {
  if (workers < 1) throw ConfigError("workers", "workers must be at least 1");
  p_.workers_ = workers;
  return *this;
}

NodeSpec& Pipeline::Builder::add(NodeSpec::Kind kind, NodeDescription description,
                                 std::string base) {
  if (base.empty()) base = description.type;
  auto taken = [&](const std::string& name) {
    for (const auto& n : p_.nodes_)
      if (n.name == name) return true;
    return false;
  };
  std::string name = base;
  for (int k = 2; taken(name); ++k) name = base + "#" + std::to_string(k);
  p_.nodes_.push_back(NodeSpec{kind, std::move(name), std::move(description)});
  return p_.nodes_.back();
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

Pipeline::Builder& Pipeline::Builder::records(RecordsOptions options) {
  NodeDescription d = options.describe();
  return source(std::move(d), source_factory<RecordsSource>(std::move(options)));
}

Pipeline::Builder& Pipeline::Builder::lines(LinesOptions options) {
  NodeDescription d = options.describe();
  return source(std::move(d), source_factory<LinesSource>(std::move(options)));
}

Pipeline::Builder& Pipeline::Builder::tar(TarOptions options) {
  NodeDescription d = options.describe();
  return source(std::move(d), source_factory<TarSource>(std::move(options)));
}

Pipeline::Builder& Pipeline::Builder::source(NodeDescription description, SourceFactory factory) {
  add(NodeSpec::Kind::kSource, std::move(description)).make_source = std::move(factory);
  return *this;
}

Pipeline::Builder& Pipeline::Builder::source(SourceSpec spec) {
  NodeSpec& n = add(NodeSpec::Kind::kSource, std::move(spec.description));
  n.make_source = std::move(spec.factory);
  n.user_collate = std::move(spec.user_collate);
  for (auto& w : spec.warnings) p_.warnings_.push_back(n.name + ": " + std::move(w));
  return *this;
}

Pipeline::Builder& Pipeline::Builder::shard(ShardOptions options) {
  ShardOptions r = options.resolved();  // validates now, with the environment of the builder
  return spine(r.describe(), [r](const std::string& name, std::uint64_t) {
    return std::make_unique<ShardNode>(name, r);
  });
}

Pipeline::Builder& Pipeline::Builder::shuffle(ShuffleOptions options) {
  if (options.mode == ShuffleMode::kBuffer && options.size == 0)
    throw ConfigError("shuffle.size", "buffer size must be greater than zero");
  return spine(options.describe(),
               [options](const std::string& name, std::uint64_t key) -> std::unique_ptr<SpineNode> {
                 std::uint64_t k = hash_combine(key, options.seed);
                 if (options.mode == ShuffleMode::kGlobal)
                   return std::make_unique<GlobalShuffleNode>(name, k);
                 return std::make_unique<BufferShuffleNode>(name, k, options.size);
               });
}

Pipeline::Builder& Pipeline::Builder::spine(NodeDescription description, SpineFactory factory) {
  add(NodeSpec::Kind::kSpine, std::move(description)).make_spine = std::move(factory);
  return *this;
}

Pipeline::Builder& Pipeline::Builder::map(SampleFn fn, MapOptions options) {
  if (!fn) throw ConfigError("map", "map needs a function");
  if (options.workers && *options.workers < 1)
    throw ConfigError("map.workers", "workers must be at least 1");
  NodeSpec& n = add(NodeSpec::Kind::kSampleMap, options.describe(), options.name);
  n.sample_fn = std::move(fn);
  n.workers = options.workers;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::mix(std::vector<Pipeline> inputs, MixOptions options) {
  std::vector<std::string> described;
  for (const auto& in : inputs) {
    std::string d;
    for (const auto& [k, v] : in.canonical()) d += (d.empty() ? "" : "; ") + k + "=" + v;
    described.push_back("{" + d + "}");
  }
  NodeSpec& n = add(NodeSpec::Kind::kMix, options.describe(described));
  options.validate(inputs.size(), n.name);
  n.mix = std::move(options);
  n.mix_inputs = std::make_shared<const std::vector<Pipeline>>(std::move(inputs));
  return *this;
}

Pipeline::Builder& Pipeline::Builder::filter(FilterFn fn, FilterOptions options) {
  if (!fn) throw ConfigError("filter", "filter needs a predicate");
  add(NodeSpec::Kind::kFilter, options.describe(), options.name).filter_fn = std::move(fn);
  return *this;
}

Pipeline::Builder& Pipeline::Builder::pack(PackOptions options) {
  if (options.length == 0)
    throw ConfigError("pack.length", "pack length must be greater than zero");
  if (options.field.empty()) throw ConfigError("pack.field", "pack needs a token field");
  add(NodeSpec::Kind::kPack, options.describe()).pack = std::move(options);
  return *this;
}

Pipeline::Builder& Pipeline::Builder::map_batch(BatchFn fn, MapOptions options) {
  if (!fn) throw ConfigError("map", "map needs a function");
  if (options.workers && *options.workers < 1)
    throw ConfigError("map.workers", "workers must be at least 1");
  NodeSpec& n = add(NodeSpec::Kind::kBatchMap, options.describe(), options.name);
  n.batch_fn = std::move(fn);
  n.workers = options.workers;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::batch(BatchOptions options) {
  if (options.size == 0) throw ConfigError("batch.size", "batch size must be greater than zero");
  add(NodeSpec::Kind::kBatch, options.describe()).batch = options;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::prefetch(PrefetchOptions options) {
  if (options.depth == 0) throw ConfigError("prefetch.depth", "prefetch depth must be at least 1");
  add(NodeSpec::Kind::kPrefetch, options.describe()).prefetch = options;
  return *this;
}

Pipeline::Builder& Pipeline::Builder::device_copy(DeviceCopyOptions options) {
  add(NodeSpec::Kind::kDeviceCopy, options.describe()).device = options;
  return *this;
}

void Pipeline::Builder::check_order() const {
  using K = NodeSpec::Kind;
  const auto& nodes = p_.nodes_;
  if (nodes.empty() || (nodes.front().kind != K::kSource && nodes.front().kind != K::kMix))
    throw ConfigError("source", "a pipeline starts with a source");
  // Phases must appear in order: source, spine, sample maps / filters / pack, batch, batch
  // maps / prefetch / device_copy.
  auto phase = [](K k) {
    switch (k) {
      case K::kSource:
      case K::kMix:
        return 0;
      case K::kSpine:
        return 1;
      case K::kSampleMap:
      case K::kFilter:
      case K::kPack:
        return 2;
      case K::kBatch:
        return 3;
      default:
        return 4;
    }
  };
  int sources = 0, last = 0;
  for (const auto& n : nodes) {
    sources += n.kind == K::kSource || n.kind == K::kMix;
    int ph = phase(n.kind);
    if (ph < last) {
      std::string why = n.kind == K::kSpine
                            ? "must come before any map, filter or pack and before batch"
                        : ph == 2 ? "must come before batch"
                                  : "is out of order";
      if (n.kind == K::kSource || n.kind == K::kMix) why = "(a source) must come first";
      throw ConfigError(n.name, "'" + n.name + "' " + why);
    }
    last = ph;
  }
  if (sources != 1) throw ConfigError("source", "a pipeline has exactly one source");
}

Pipeline Pipeline::Builder::build() const {
  using K = NodeSpec::Kind;
  check_order();
  const auto& nodes = p_.nodes_;
  int batches = 0, copies = 0;
  for (const auto& n : nodes) {
    batches += n.kind == K::kBatch;
    copies += n.kind == K::kDeviceCopy;
  }
  if (batches != 1) throw ConfigError("batch", "a pipeline needs exactly one batch node");
  if (copies > 1) throw ConfigError("device_copy", "at most one device_copy");
  if (copies == 1 && nodes.back().kind != K::kDeviceCopy)
    throw ConfigError("device_copy", "device_copy must be the last node");
  say_warnings(p_.warnings_);
  return p_;
}

Pipeline Pipeline::Builder::build_input() const {
  using K = NodeSpec::Kind;
  check_order();
  for (const auto& n : p_.nodes_) {
    if (n.kind == K::kSource || n.kind == K::kSpine || n.kind == K::kSampleMap ||
        n.kind == K::kFilter)
      continue;
    throw ConfigError(n.name, "'" + n.name +
                                  "' cannot be part of a mix input: an input is a source with "
                                  "shard, shuffle, filter and per-sample maps");
  }
  say_warnings(p_.warnings_);
  return p_;
}

}  // namespace flowstate
