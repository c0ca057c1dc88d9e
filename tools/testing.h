// The save/restore oracle for anyone's node (STYLE.md), as a library function without a test
// framework: run a pipeline uninterrupted, then for several breakpoints consume k batches, save
// the state, destroy the Loader, build a fresh one, load the state and drain it; the
// concatenation must equal the uninterrupted run, batch for batch. A node's author runs it on
// a pipeline holding the node and checks the report:
//
//   auto make = [&] {
//     return Pipeline::Builder().records(...).add(take_node(), TakeOptions{.count = 100})
//         .batch({.size = 16}).build();
//   };
//   OracleReport r = flowstate::testing::check_save_restore(make, {.epochs = 2, .workers = 1},
//                                                           {.epochs = 2, .workers = 2});
//   if (!r.ok()) std::cerr << r.summary();
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "flowstate/graph/loader.h"
#include "flowstate/tools/mix_weights.h"

namespace flowstate::testing {

/// A compact, comparable trace of one delivered batch: what the oracle compares.
struct BatchTrace {
  std::uint64_t step, epoch, index_in_epoch;
  bool last;                  ///< is_last_in_epoch
  std::uint32_t num_samples;  ///< samples in the batch
  std::uint32_t remainder;    ///< valid samples of a short last batch; 0 when full
  std::uint64_t digest;       ///< Batch::digest(): the batch's fields and provenance
  bool operator==(const BatchTrace&) const = default;
  /// "{step 7 epoch 0 index 7 last samples 16 rem 4 digest 00a1...}".
  std::string to_string() const;
};
std::ostream& operator<<(std::ostream& os, const BatchTrace& t);
/// The trace of `b`.
BatchTrace trace(const Batch& b);

/// Drains `loader` (at most `limit` batches) into traces. Throws what Loader::next throws.
std::vector<BatchTrace> drain(Loader& loader, std::size_t limit = SIZE_MAX);

/// What check_save_restore found.
struct OracleReport {
  std::size_t batches = 0;               ///< batches of the uninterrupted run
  std::vector<std::size_t> breakpoints;  ///< batches consumed before each save, in order
  /// One readable line per failed breakpoint, naming it and the first differing batch.
  std::vector<std::string> failures;

  /// True when every breakpoint reproduced the uninterrupted run.
  bool ok() const { return failures.empty(); }
  /// One line saying what was checked, then the failures, one per line.
  std::string summary() const;
};

/// The save/restore oracle (see the file comment). Breakpoints: 0, 1, mid first epoch, the
/// last batch of the first epoch, the epoch's end, mid second epoch, and the end. `make` is
/// called once per Loader; the uninterrupted run and every run before a save use `options`,
/// every restored run `restore_options` (which may differ in free options, like workers).
/// Each delivered batch must equal the uninterrupted run's in step, epoch, index_in_epoch,
/// is_last_in_epoch, remainder, num_samples and digest. An exception while consuming, saving,
/// restoring or draining a breakpoint is that breakpoint's failure; an exception of the
/// uninterrupted run propagates. A run without batches is a failure (nothing was checked).
OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                                LoaderOptions restore_options);
/// The same, restoring with `options`.
OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options);
/// The same for a run whose mix weights change while it runs: every run — the uninterrupted
/// one, each run up to a breakpoint and each restored one — applies `weights`
/// (MixWeightsSchedule::apply before every batch), so a restored run gets the weights in
/// force from its state and the later ones as it reaches them.
OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                                LoaderOptions restore_options, std::vector<MixWeightsAt> weights);

/// The same from `state` (a checkpoint; a run resumed over changed data, say, with
/// `options.on_data_change`): the uninterrupted run and every run up to a breakpoint load it
/// first, and there is a breakpoint after every batch (a run of a few dozen batches: each
/// breakpoint drains the rest). What checks that a run which continued over a change of its
/// data still resumes exactly at every step.
OracleReport check_save_restore_from(const std::function<Pipeline()>& make, LoaderOptions options,
                                     const std::string& state);

}  // namespace flowstate::testing
