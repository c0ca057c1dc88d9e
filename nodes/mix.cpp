#include "nodes/mix.h"

#include <cmath>

#include <cereal/types/string.hpp>

#include "core/rng.h"

namespace flowstate {

std::string_view mix_stop_name(MixStop stop) {
  switch (stop) {
    case MixStop::kFirstExhausted:
      return "first_exhausted";
    case MixStop::kAllExhausted:
      return "all_exhausted";
    case MixStop::kCycle:
      return "cycle";
  }
  return "?";
}

NodeDescription MixOptions::describe(const std::vector<std::string>& inputs) const {
  NodeDescription d{"mix", {}};
  std::string w;
  for (double x : weights) w += (w.empty() ? "" : ", ") + format_double(x);
  d.params.push_back({"weights", "[" + w + "]"});
  d.params.push_back({"stop", std::string(mix_stop_name(stop))});
  for (std::size_t i = 0; i < inputs.size(); ++i)
    d.params.push_back({"inputs[" + std::to_string(i) + "]", inputs[i]});
  return d;
}

void MixOptions::validate(std::size_t inputs, const std::string& node) const {
  if (inputs < 2) throw ConfigError(node + ".inputs", "mix needs at least two inputs");
  if (weights.size() != inputs)
    throw ConfigError(node + ".weights", "mix has " + std::to_string(inputs) + " inputs but " +
                                             std::to_string(weights.size()) + " weights");
  for (double w : weights)
    if (!(w > 0) || !std::isfinite(w))
      throw ConfigError(node + ".weights", "every weight must be a positive number");
}

namespace {

/// The mix's own state, then every input node's name and state.
class MixSnapshot final : public NodeSnapshot {
 public:
  MixState state;
  std::vector<std::pair<std::string, std::shared_ptr<const NodeSnapshot>>> nodes;
  void save(OutArchive& ar) const override {
    ar(state);
    for (const auto& [name, snap] : nodes) {
      ar(name);
      snap->save(ar);
    }
  }
};

}  // namespace

MixNode::MixNode(std::string name, MixOptions options, std::uint64_t key,
                 std::vector<MixInput> inputs)
    : SpineNode(std::move(name)),
      options_(std::move(options)),
      key_(key),
      inputs_(std::move(inputs)) {
  options_.validate(inputs_.size(), this->name());
  state_.resize(inputs_.size());
  state_.expected_inputs = static_cast<std::uint32_t>(inputs_.size());
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
  double total = 0;
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (!(skip_exhausted && state_.exhausted[i])) total += options_.weights[i];
  if (total == 0) return std::nullopt;
  // 53 random bits → [0, 1): the draw is a pure function of (key, epoch, draw number).
  const double u =
      static_cast<double>(philox64(key_, state_.epoch, state_.draws++) >> 11) * 0x1p-53 * total;
  double acc = 0;
  std::optional<std::size_t> last;
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    if (skip_exhausted && state_.exhausted[i]) continue;
    acc += options_.weights[i];
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
  for (const auto& in : inputs_)
    for (const auto& node : in.nodes) s->nodes.emplace_back(node->name(), node->snapshot());
  return s;
}

void MixNode::restore(InArchive& ar) {
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
      node->restore(ar);
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

void MixNode::release(std::span<const Ref> refs) const {
  for (const Ref& r : refs) input_of(r).store->release({&r, 1});
}

}  // namespace flowstate
