// `mix`: weighted sampling from several input pipelines (each a source with its own shard,
// shuffle, filter and per-sample maps). Every output position draws an input from a
// counter-based generator keyed by (seed, epoch, draw) — no draw depends on an earlier one
// — and the state holds the counters (draws, samples taken, which inputs are exhausted) and
// every input's own state, so a resume is O(1): nothing is replayed.
//
// Stop criteria, when a drawn input has no sample left in its epoch:
//   first_exhausted — the mix's epoch ends there;
//   all_exhausted   — that input leaves the draw (weights renormalise over the rest); the
//                     epoch ends when every input is exhausted;
//   cycle           — that input starts its next epoch (reshuffled) and stays in the draw;
//                     the epoch ends once every input has been exhausted at least once.
// With first_exhausted and all_exhausted every input runs its epoch e in the mix's epoch e;
// with cycle each input counts its own epochs.
//
// A checkpoint holds only what differs from a fresh start: an input that has not been pulled
// since it started its epoch (most of a mix of thousands, early in an epoch) is saved as
// nothing at all when that epoch is the mix's, or as its epoch alone, and a restore starts it
// again (a node's state after start_epoch(e) is a function of e). So a mix's state grows with
// the inputs it has drawn from, not with the inputs it has.
//
// Refs keep their input's number as Ref::source; the mix is the RecordStore that reads them
// through that input (maps inside an input key their generators by record only: the store
// is not told the epoch — put epoch-varying random maps after the mix).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

/// When a mix's epoch ends (see the file comment).
enum class MixStop : std::uint8_t { kFirstExhausted, kAllExhausted, kCycle };
template <>
struct EnumNames<MixStop> {
  static constexpr std::array<std::pair<MixStop, const char*>, 3> values{
      {{MixStop::kFirstExhausted, "first_exhausted"},
       {MixStop::kAllExhausted, "all_exhausted"},
       {MixStop::kCycle, "cycle"}}};
};
/// "first_exhausted", "all_exhausted", "cycle".
std::string_view mix_stop_name(MixStop stop);

/// Options of the `mix` node. Its inputs are pipelines (Pipeline::Builder::mix).
struct MixOptions {
  std::vector<double> weights;  ///< one per input, > 0; need not sum to 1
  MixStop stop = MixStop::kFirstExhausted;
  /// The inputs' canonical descriptions, for the fingerprint; the builder sets them.
  std::vector<std::string> inputs;

  static constexpr auto table() {
    return std::tuple{
        param("stop", &MixOptions::stop,
              {.doc = "first_exhausted, all_exhausted or cycle: when an epoch of the mix ends"})};
  }
  NodeDescription describe() const;
  /// Throws ConfigError (key "inputs" / "weights") unless there are at least two inputs and
  /// one positive, finite weight for each.
  void validate() const;
};

/// The `mix` node's definition.
const NodeDef& mix_node();

/// One instantiated input of a mix: its spine chain (source first) and how to read its Refs.
struct MixInput {
  std::string name;                                ///< "input0", ... in errors
  std::vector<std::unique_ptr<SpineNode>> nodes;   ///< connected, source first
  std::vector<std::unique_ptr<SampleReader>> own;  ///< readers the chain's nodes use
  const RecordStore* store = nullptr;              ///< the input's source
  std::unique_ptr<SampleReader> reader;            ///< the input's Refs with its maps applied
  SpineNode* tail = nullptr;  ///< what the mix pulls from (Chain::tail); null: nodes.back()
};

/// State of a mix (the inputs' states are saved after it: those not fresh, version 2).
struct MixState {
  std::uint64_t epoch = 0;
  std::uint64_t draws = 0;  ///< generator counter in this epoch
  bool ended = false;       ///< this epoch has ended
  std::vector<std::uint64_t> input_epoch;
  std::vector<std::uint64_t> taken;     ///< samples taken from each input in this epoch
  std::vector<std::uint8_t> exhausted;  ///< each input ran out in this epoch
  std::vector<std::uint8_t> started;    ///< each input has started an epoch
  /// Each input has not been pulled since it started input_epoch: its nodes' state is that
  /// of start_epoch(input_epoch), and is not saved (version 2; version 1 saved every input's).
  std::vector<std::uint8_t> fresh;
  /// The weights in force when they are not the options' (set while running,
  /// Loader::set_mix_weights); empty: the options' (version 3).
  std::vector<double> weights;

  /// True when input `i` is as the mix's start_epoch(epoch) leaves it: saved as nothing.
  bool untouched(std::size_t i) const {
    return fresh[i] != 0 && started[i] != 0 && input_epoch[i] == epoch && taken[i] == 0 &&
           exhausted[i] == 0;
  }
  template <class Archive>
  void save(Archive& ar, std::uint32_t) const {
    // Version 2: the inputs that are not untouched, by number; then (MixSnapshot) the nodes of
    // those that are not fresh.
    ar(epoch, draws, ended, static_cast<std::uint32_t>(taken.size()));
    std::uint32_t touched = 0;
    for (std::size_t i = 0; i < taken.size(); ++i) touched += untouched(i) ? 0 : 1;
    ar(touched);
    for (std::size_t i = 0; i < taken.size(); ++i)
      if (!untouched(i))
        ar(static_cast<std::uint32_t>(i), input_epoch[i], taken[i], exhausted[i], started[i],
           fresh[i]);
    // Version 3: the weights in force, when set while running (else a 0 byte).
    ar(static_cast<std::uint8_t>(weights.empty() ? 0 : 1));
    if (weights.empty()) return;
    ar(static_cast<std::uint32_t>(weights.size()));
    for (double w : weights) ar(w);
  }
  template <class Archive>
  void load(Archive& ar, std::uint32_t version) {
    require_state_version("MixState", version, 3);
    std::uint32_t n = 0;
    ar(epoch, draws, ended, n);
    // Checked against the pipeline's inputs before anything is allocated for them.
    if (n != expected_inputs)
      throw CheckpointError("state", "the mix state holds " + std::to_string(n) +
                                         " inputs, this pipeline's mix has " +
                                         std::to_string(expected_inputs));
    resize(n);
    if (version < 2) {
      for (std::size_t i = 0; i < n; ++i) ar(input_epoch[i], taken[i], exhausted[i], started[i]);
      return;  // every input's nodes follow
    }
    for (std::size_t i = 0; i < n; ++i) {  // untouched unless listed
      input_epoch[i] = epoch;
      started[i] = fresh[i] = 1;
    }
    std::uint32_t touched = 0;
    ar(touched);
    if (touched > n)
      throw CheckpointError("state", "the mix state lists " + std::to_string(touched) + " of its " +
                                         std::to_string(n) + " inputs");
    std::uint32_t last = 0;
    for (std::uint32_t k = 0; k < touched; ++k) {
      std::uint32_t i = 0;
      ar(i);
      if (i >= n || (k > 0 && i <= last))
        throw CheckpointError("state", "the mix state lists input " + std::to_string(i) +
                                           " out of order or out of its " + std::to_string(n));
      last = i;
      ar(input_epoch[i], taken[i], exhausted[i], started[i], fresh[i]);
    }
    if (version < 3) return;
    std::uint8_t set = 0;
    ar(set);
    if (set == 0) return;
    std::uint32_t w = 0;
    ar(w);
    if (w != n)
      throw CheckpointError("state", "the mix state holds " + std::to_string(w) +
                                         " weights for its " + std::to_string(n) + " inputs");
    weights.resize(w);
    for (double& x : weights) ar(x);
  }
  void resize(std::size_t n) {
    input_epoch.assign(n, 0);
    taken.assign(n, 0);
    exhausted.assign(n, 0);
    started.assign(n, 0);
    fresh.assign(n, 0);
  }
  std::uint32_t expected_inputs = 0;  ///< set before loading; not saved
};

/// The `mix` node: a source built from other pipelines' spines.
class MixNode final : public SpineNode, public RecordStore {
 public:
  MixNode(std::string name, MixOptions options, std::uint64_t key, std::vector<MixInput> inputs);

  void connect(SpineNode* upstream) override;
  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;
  std::shared_ptr<const NodeSnapshot> snapshot() const override;
  void restore(InArchive& ar) override;
  void restore_legacy(InArchive& ar) override;
  /// The rules of a data change (docs/DECISIONS.md, "Changing the data mid-run"): new weights
  /// apply from the next draw; inputs are matched by description — a kept input keeps its
  /// position, an added one starts its epoch, a removed one's state is dropped.
  void restore_changed(InArchive& ar, const DataChange& change) override;

  std::size_t record_bytes() const override { return 0; }
  std::span<const std::byte> record(const Ref& ref) const override;
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return 0; }
  void release(std::span<const Ref> refs) const override;
  /// The input store's view, for inputs without maps (what pack and filter see is the record).
  std::optional<RecordView> view(const Ref& ref, FieldId field) const override;
  bool rereadable() const override;

  const MixState& state() const { return state_; }
  /// The weights the draws use now.
  const std::vector<double>& weights() const {
    return state_.weights.empty() ? options_.weights : state_.weights;
  }

 private:
  SpineNode& tail(std::size_t i) const {
    return inputs_[i].tail != nullptr ? *inputs_[i].tail : *inputs_[i].nodes.back();
  }
  void start_input(std::size_t i, std::uint64_t epoch);
  /// Draws an input among those still in the draw; none left: nullopt.
  std::optional<std::size_t> draw();
  const MixInput& input_of(const Ref& ref) const;

  MixOptions options_;
  std::uint64_t key_;
  std::vector<MixInput> inputs_;
  std::vector<char> viewable_;  ///< per input: no maps, so its store's views are its samples
  MixState state_;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::MixState, 3);
