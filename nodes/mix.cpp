#include "flowstate/nodes/mix.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <cereal/types/string.hpp>

#include "flowstate/core/rng.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/sources/file_source.h"

namespace flowstate {

std::string_view mix_stop_name(MixStop stop) { return enum_name(stop); }

namespace {

std::string weights_text(const std::vector<double>& weights) {
  std::string w;
  for (double x : weights) w += (w.empty() ? "" : ", ") + format_double(x);
  return "[" + w + "]";
}

/// "[0.7, 0.3]" (weights_text) back to numbers; nullopt when it is not that form.
std::optional<std::vector<double>> parse_weights(std::string_view text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = text.substr(1, text.size() - 2);
  std::vector<double> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    double w = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
    if (ec != std::errc() || end != item.data() + item.size()) return std::nullopt;
    out.push_back(w);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

NodeDescription MixOptions::describe() const {
  // `weights` and `inputs` are data parameters: a resume that opts in continues over a change
  // of them (MixNode::restore_changed); `stop` is not.
  NodeDescription d{"mix", {}};
  d.params.push_back({"weights", weights_text(weights), false, true});
  d.params.push_back({"stop", std::string(mix_stop_name(stop))});
  for (std::size_t i = 0; i < inputs.size(); ++i)
    d.params.push_back({"inputs[" + std::to_string(i) + "]", inputs[i], false, true});
  return d;
}

void MixOptions::validate() const {
  if (inputs.size() < 2) throw ConfigError("inputs", "mix needs at least two inputs");
  if (weights.size() != inputs.size())
    throw ConfigError("weights", "mix has " + std::to_string(inputs.size()) + " inputs but " +
                                     std::to_string(weights.size()) + " weights");
  for (std::size_t i = 0; i < weights.size(); ++i)
    if (!(weights[i] > 0) || !std::isfinite(weights[i]))
      throw ConfigError("weights", "weights[" + std::to_string(i) + "] is " +
                                       format_double(weights[i]) +
                                       ": every weight must be a positive number (finite, > 0)");
}

namespace {

std::string inspect_mix(InArchive& ar, const InspectContext& ctx) {
  std::vector<std::string> inputs;
  for (std::size_t k = 0;; ++k) {
    std::string text = ctx.param("inputs[" + std::to_string(k) + "]");
    if (text.empty()) break;
    inputs.push_back(std::move(text));
  }
  MixState s;
  s.expected_inputs = static_cast<std::uint32_t>(inputs.size());
  ar(s);
  JsonObject j;
  j.add("epoch", s.epoch).add("draws", s.draws).add("ended", s.ended);
  if (!s.weights.empty()) j.add("weights", weights_text(s.weights));  // set while running
  std::string list = "[";
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    JsonObject in;
    in.add("epoch", s.input_epoch[k])
        .add("taken", s.taken[k])
        .add("exhausted", s.exhausted[k] != 0);
    // A fresh input's nodes are at the start of its epoch: the state does not hold them.
    if (s.fresh[k] != 0)
      in.add("fresh", true);
    else
      in.add_raw("nodes", ctx.nested(load_entries(ar), inputs[k]));
    if (k != 0) list += ',';
    list += in.str();
  }
  j.add_raw("inputs", list + "]");
  return j.str();
}

}  // namespace

namespace {

/// `- mix: {inputs: [a.yaml, b.yaml], weights: [...]}`: input pipeline files, read with the
/// caller's registries (relative to this file).
std::shared_ptr<const YamlForm> mix_yaml(const NodeDef& def) {
  auto f = std::make_shared<YamlForm>();
  f->params = {
      {.name = "inputs",
       .type = ParamType::kStringList,
       .doc = "input pipeline files (source, shard, shuffle, filter, maps); relative to this file",
       .required = true,
       .data = true,
       .check = check_paths},
      {.name = "weights",
       .type = ParamType::kStringList,
       .doc = "one positive number per input",
       .required = true,
       .data = true},
  };
  for (const auto& p : def.params) f->params.push_back(p);  // stop
  f->read = [](YamlContext& ctx) {
    const Params& p = ctx.params();
    MixOptions o;
    const auto& ws = p.strings("weights");
    for (std::size_t i = 0; i < ws.size(); ++i) {
      double w = 0;
      auto [end, ec] = std::from_chars(ws[i].data(), ws[i].data() + ws[i].size(), w);
      if (ec != std::errc() || end != ws[i].data() + ws[i].size() || !(w > 0) || !std::isfinite(w))
        throw ConfigError("weights", "weights[" + std::to_string(i) + "]: '" + ws[i] +
                                         "' is not a positive number");
      o.weights.push_back(w);
    }
    o.stop = options_from<MixOptions>(p).stop;
    std::vector<std::filesystem::path> files;
    for (const auto& path : p.strings("inputs")) {
      std::filesystem::path f(path);
      if (f.is_relative() && !ctx.base_dir().empty()) f = ctx.base_dir() / f;
      files.push_back(std::move(f));
    }
    o.inputs = ctx.read_inputs(files);
    ctx.add(mix_node(), std::move(o));
  };
  return f;
}

}  // namespace

const NodeDef& mix_node() {
  static const NodeDef def = [] {
    NodeDef d = define_node<MixOptions>(
        {.type = "mix",
         .phase = Phase::kSource,
         .doc = "samples from several input pipelines (YAML files without batch) by weight",
         // Inputs are addressed by Ref::source: a mix inside an input would collide.
         .placement = {.in_mix_input = false}},
        [](BuildContext& ctx, const MixOptions& o) {
          std::vector<MixInput> inputs;
          for (std::size_t j = 0; j < ctx.inputs(); ++j) {
            Chain sub = ctx.build_input(j);
            MixInput in;
            in.name = "input " + std::to_string(j);
            in.tail = sub.tail;
            in.nodes = std::move(sub.nodes);
            in.own = std::move(sub.readers);
            in.store = sub.store;
            in.reader = std::make_unique<MappedReader>(sub.store, sub.store_name, sub.stages,
                                                       sub.stages->size());
            inputs.push_back(std::move(in));
          }
          auto mix = std::make_unique<MixNode>(ctx.name(), o, ctx.key(), std::move(inputs));
          const RecordStore* store = mix.get();
          ctx.add_store(std::move(mix), store);
        },
        inspect_mix);
    d.yaml = mix_yaml(d);
    return d;
  }();
  return def;
}

namespace {

/// The mix's own state, then the stamp (its nodes' entries) of every input not fresh.
class MixSnapshot final : public NodeSnapshot {
 public:
  MixState state;
  std::vector<Stamp> inputs;  ///< of the inputs not fresh, in order
  void save(OutArchive& ar) const override {
    ar(state);
    for (const auto& in : inputs) save_entries(ar, *in);
  }
};

}  // namespace

MixNode::MixNode(std::string name, MixOptions options, std::uint64_t key,
                 std::vector<MixInput> inputs)
    : SpineNode(std::move(name)),
      options_(std::move(options)),
      key_(key),
      inputs_(std::move(inputs)) {
  state_.resize(inputs_.size());
  state_.expected_inputs = static_cast<std::uint32_t>(inputs_.size());
  for (const MixInput& in : inputs_)
    viewable_.push_back(reads_store_unmapped(in.reader.get(), in.store));
}

void MixNode::connect(SpineNode* upstream) {
  if (upstream != nullptr) throw ConfigError(name(), "mix is a source: it has no upstream");
}

std::uint64_t MixNode::size(std::uint64_t epoch) const {
  // Empty only when every input is; otherwise known once the draws have run out.
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (tail(i).size(epoch) != 0) return kUnknownSize;
  return 0;
}

void MixNode::start_input(std::size_t i, std::uint64_t epoch) {
  tail(i).start_epoch(epoch);
  state_.input_epoch[i] = epoch;
  state_.started[i] = 1;
  state_.fresh[i] = 1;
}

void MixNode::start_epoch(std::uint64_t epoch) {
  state_.epoch = epoch;
  state_.draws = 0;
  state_.ended = false;
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    state_.taken[i] = 0;
    state_.exhausted[i] = 0;
    // Under cycle an input goes on where it is; the first epoch starts every input.
    if (options_.stop != MixStop::kCycle || state_.started[i] == 0) start_input(i, epoch);
  }
}

std::optional<std::size_t> MixNode::draw() {
  const bool skip_exhausted = options_.stop == MixStop::kAllExhausted;
  auto in_draw = [&](std::size_t i) { return !(skip_exhausted && state_.exhausted[i]); };
  // The weights in the draw are scaled by a power of two that brings the largest into [1, 2)
  // before they are summed: weights near the top of the double range cannot overflow the
  // sum, and subnormal ones keep their ratios instead of rounding away. A power of two
  // scales exactly, so ordinary weights draw exactly as unscaled ones would.
  double largest = 0;
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (in_draw(i)) largest = std::max(largest, weights()[i]);
  if (largest == 0) return std::nullopt;
  const int scale = -std::ilogb(largest);
  auto weight = [&](std::size_t i) { return std::ldexp(weights()[i], scale); };
  double total = 0;
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (in_draw(i)) total += weight(i);
  // 53 random bits → [0, 1): the draw is a pure function of (key, epoch, draw number).
  const double u =
      static_cast<double>(philox64(key_, state_.epoch, state_.draws++) >> 11) * 0x1p-53 * total;
  double acc = 0;
  std::optional<std::size_t> last;
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    if (!in_draw(i)) continue;
    acc += weight(i);
    last = i;
    if (u < acc) return i;
  }
  return last;  // rounding at the top end
}

std::size_t MixNode::pull(std::span<Ref> out) {
  std::size_t n = 0;
  while (n < out.size() && !state_.ended) {
    std::optional<std::size_t> pick = draw();
    if (!pick) {
      state_.ended = true;
      break;
    }
    const std::size_t i = *pick;
    state_.fresh[i] = 0;
    if (tail(i).pull(out.subspan(n, 1)) == 1) {
      ++state_.taken[i];
      ++n;
      continue;
    }
    state_.exhausted[i] = 1;
    switch (options_.stop) {
      case MixStop::kFirstExhausted:
        state_.ended = true;
        break;
      case MixStop::kAllExhausted:
        break;  // the next draw leaves it out
      case MixStop::kCycle: {
        bool all = true;
        for (auto e : state_.exhausted) all = all && e != 0;
        if (all) {
          state_.ended = true;
          break;
        }
        // Every draw of another input makes progress, so an empty input cannot spin.
        start_input(i, state_.input_epoch[i] + 1);
        state_.taken[i] = 0;
        break;
      }
    }
  }
  return n;
}

std::shared_ptr<const NodeSnapshot> MixNode::snapshot() const {
  auto s = std::make_shared<MixSnapshot>();
  s->state = state_;
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (state_.fresh[i] == 0) s->inputs.push_back(snapshot_nodes(inputs_[i].nodes));
  return s;
}

void MixNode::restore(InArchive& ar) {
  MixState s;
  s.expected_inputs = static_cast<std::uint32_t>(inputs_.size());
  ar(s);
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    if (s.fresh[i] == 0) {
      restore_nodes(inputs_[i].nodes, load_entries(ar), "state");
    } else if (s.started[i] == 0) {
      throw CheckpointError(
          "state", "mix '" + name() + "' holds " + inputs_[i].name + " as fresh but never started");
    } else {
      tail(i).start_epoch(s.input_epoch[i]);  // as it was saved: at the start of that epoch
    }
  }
  state_ = std::move(s);
}

void MixNode::restore_changed(InArchive& ar, const DataChange& change) {
  // The inputs the state was saved with, as the checkpoint described them.
  std::vector<std::string> was;
  for (std::size_t k = 0;; ++k) {
    auto d = change.before_param(name(), "inputs[" + std::to_string(k) + "]");
    if (!d) break;
    was.push_back(std::move(*d));
  }
  if (was.empty())
    throw CheckpointError("state",
                          "mix '" + name() + "': the state's pipeline describes no inputs");
  MixState s;
  s.expected_inputs = static_cast<std::uint32_t>(was.size());
  ar(s);
  std::vector<std::optional<std::vector<StampEntry>>> entries(was.size());
  for (std::size_t i = 0; i < was.size(); ++i)
    if (s.fresh[i] == 0) entries[i] = load_entries(ar);

  // Inputs are matched by their whole description, in order: an input whose parameters
  // changed is a removed input and an added one.
  const std::vector<std::string>& now = options_.inputs;
  std::vector<std::optional<std::size_t>> from(now.size());
  std::vector<char> kept(was.size(), 0);
  for (std::size_t j = 0; j < now.size(); ++j)
    for (std::size_t i = 0; i < was.size(); ++i)
      if (kept[i] == 0 && was[i] == now[j]) {
        from[j] = i;
        kept[i] = 1;
        break;
      }
  const std::string prefix = name() + ": ";
  if (change.downstream == UpstreamHold::kRefs)
    for (std::size_t j = 0; j < std::max(now.size(), was.size()); ++j) {
      // Input j is not the checkpoint's input j: another, a new one where one was, or gone.
      const bool moved = j < now.size() ? (from[j] ? *from[j] != j : j < was.size()) : true;
      if (moved)
        throw CheckpointError(
            "state", "mix '" + name() + "': '" + change.downstream_node +
                         "' after it holds Refs of its inputs by number, so inputs may only be "
                         "added after the last one (and none removed, reordered or changed); " +
                         "input " + std::to_string(j) + " is not the checkpoint's");
    }

  MixState n;
  n.expected_inputs = static_cast<std::uint32_t>(inputs_.size());
  n.resize(inputs_.size());
  n.epoch = s.epoch;
  n.draws = s.draws;
  n.ended = s.ended;
  std::vector<std::string> notes;
  for (std::size_t j = 0; j < inputs_.size(); ++j) {
    if (!from[j]) {
      // Added: at the start of the mix's epoch, from the next draw on.
      tail(j).start_epoch(s.epoch);
      n.input_epoch[j] = s.epoch;
      n.started[j] = n.fresh[j] = 1;
      notes.push_back(prefix + "input " + std::to_string(j) +
                      " added, from its beginning: " + now[j]);
      continue;
    }
    const std::size_t i = *from[j];
    n.input_epoch[j] = s.input_epoch[i];
    n.taken[j] = s.taken[i];
    n.exhausted[j] = s.exhausted[i];
    n.started[j] = s.started[i];
    n.fresh[j] = s.fresh[i];
    if (entries[i]) {
      restore_nodes(inputs_[j].nodes, *entries[i], "state");
    } else if (s.started[i] == 0) {
      throw CheckpointError("state", "mix '" + name() + "' holds input " + std::to_string(i) +
                                         " as fresh but never started");
    } else {
      tail(j).start_epoch(s.input_epoch[i]);
    }
    if (i != j)
      notes.push_back(prefix + "input " + std::to_string(i) + " is now input " + std::to_string(j));
  }
  for (std::size_t i = 0; i < was.size(); ++i)
    if (kept[i] == 0)
      notes.push_back(prefix + "input " + std::to_string(i) + " removed after " +
                      std::to_string(s.taken[i]) + " samples of its epoch " +
                      std::to_string(s.input_epoch[i]) + ": " + was[i]);

  // The weights in force: set now, or the state's (set while running) while the
  // configuration's weights and inputs are the checkpoint's, else the configuration's.
  const auto before_weights = change.before_param(name(), "weights");
  std::vector<double> old_force = s.weights;
  if (old_force.empty())
    if (auto w = before_weights ? parse_weights(*before_weights) : std::nullopt) old_force = *w;
  if (auto set = change.set_param(name(), "weights")) {
    std::optional<std::vector<double>> w = parse_weights(*set);
    if (!w || w->size() != inputs_.size())
      throw ConfigError(
          "weights", "mix '" + name() + "' has " + std::to_string(inputs_.size()) + " inputs but " +
                         std::to_string(w ? w->size() : std::size_t{0}) + " weights were given");
    for (std::size_t i = 0; i < w->size(); ++i)
      if (!((*w)[i] > 0) || !std::isfinite((*w)[i]))
        throw ConfigError("weights", "weights[" + std::to_string(i) + "] is " +
                                         format_double((*w)[i]) +
                                         ": every weight must be a positive number (finite, > 0)");
    if (*w != old_force) {
      notes.push_back(prefix + "weights " + weights_text(old_force) + " -> " + weights_text(*w) +
                      " (set while running)");
      n.weights = *w == options_.weights ? std::vector<double>{} : *w;
    } else {
      n.weights = s.weights;
    }
  } else if (before_weights == weights_text(options_.weights) && was == now) {
    n.weights = s.weights;
  } else if (!s.weights.empty()) {
    notes.push_back(prefix + "the weights set while running, " + weights_text(s.weights) +
                    ", give way to the configuration's " + weights_text(options_.weights));
  }
  state_ = std::move(n);
  for (auto& note : notes) change.notes.push_back(std::move(note));
}

void MixNode::restore_legacy(InArchive& ar) {
  MixState s;
  s.expected_inputs = static_cast<std::uint32_t>(inputs_.size());
  ar(s);
  for (auto& in : inputs_) {
    for (auto& node : in.nodes) {
      std::string name;
      load_bounded(ar, name);
      if (name != node->name())
        throw CheckpointError("state", "mix '" + this->name() + "' holds node '" + name +
                                           "' where " + in.name + " has '" + node->name() + "'");
      node->restore_legacy(ar);
    }
  }
  state_ = std::move(s);
}

const MixInput& MixNode::input_of(const Ref& ref) const {
  if (ref.source >= inputs_.size())
    throw Error("mix '" + name() + "' has no input " + std::to_string(ref.source));
  return inputs_[ref.source];
}

std::span<const std::byte> MixNode::record(const Ref& ref) const {
  return input_of(ref).store->record(ref);
}

void MixNode::read(const Ref& ref, Sample& sample) const {
  input_of(ref).reader->read(ref, 0, sample);
}

bool MixNode::rereadable() const {
  for (const auto& in : inputs_)
    if (!in.store->rereadable()) return false;
  return true;
}

std::optional<RecordView> MixNode::view(const Ref& ref, FieldId field) const {
  const MixInput& in = input_of(ref);
  if (viewable_[ref.source] == 0) return std::nullopt;
  return in.store->view(ref, field);
}

void MixNode::release(std::span<const Ref> refs) const {
  for (const Ref& r : refs) input_of(r).store->release({&r, 1});
}

}  // namespace flowstate
