// A schedule of mix weights set while running (Loader::set_mix_weights): "from step S on, mix
// NODE draws with weights W". `flowstate run` and `flowstate verify` read one from
// --mix-weights / --weights-schedule, and verify and the save/restore oracle (testing.h)
// apply one to every run they compare, so a pipeline whose weights change during the run is
// proven to resume exactly like any other.
//
//   MixWeightsSchedule s({{.step = 100, .node = "mix", .weights = {1, 5}}});
//   for (;;) {
//     s.apply(loader, loader.last_step() ? *loader.last_step() + 1 : 0);
//     auto b = loader.next();
//     ...
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/graph/loader.h"

namespace flowstate {

/// From step `step` on, mix node `node` draws with `weights`.
struct MixWeightsAt {
  std::uint64_t step = 0;
  std::string node;
  std::vector<double> weights;
  bool operator==(const MixWeightsAt&) const = default;
};

/// Parses "STEP:NODE=W,W,..." (`--mix-weights 100:mix=0.2,0.8`); throws ConfigError on
/// `origin` (the flag, or FILE:LINE) saying what is wrong.
MixWeightsAt parse_mix_weights(std::string_view text, const std::string& origin);
/// The entries of a schedule file: one "STEP:NODE=W,W" per line; '#' starts a comment, blank
/// lines are ignored. Throws ConfigError naming the file (and line).
std::vector<MixWeightsAt> read_mix_weights_schedule(const std::string& path);

/// Entries applied in step order as a run reaches them.
class MixWeightsSchedule {
 public:
  MixWeightsSchedule() = default;
  /// Sorted by step (stably: of two entries of one node at one step, the later wins).
  explicit MixWeightsSchedule(std::vector<MixWeightsAt> entries);

  /// Before the batch of step `next`: sets the weights due by then that this schedule has
  /// not set yet — of each node, the latest. So a run resumed at step N gets the weights in
  /// force at N, which its state already holds (set_mix_weights records nothing then).
  /// Returns whether any were set. Throws what set_mix_weights throws.
  bool apply(Loader& loader, std::uint64_t next);
  /// The same, at the step after the loader's last delivered one.
  bool apply(Loader& loader);
  bool empty() const { return entries_.empty(); }
  const std::vector<MixWeightsAt>& entries() const { return entries_; }

 private:
  std::vector<MixWeightsAt> entries_;
  std::size_t done_ = 0;
};

}  // namespace flowstate
