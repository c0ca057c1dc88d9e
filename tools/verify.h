// verify: proves that a pipeline resumes exactly. An uninterrupted run of `steps` batches gives
// the reference; then checkpoints are written through real checkpoint files at random steps,
// and each is restored into a fresh Loader (with another worker count) that runs on to the
// end of the reference. Every restored batch must equal the reference one: step, epoch,
// index_in_epoch, is_last_in_epoch and digest. `flowstate verify` is this function on a YAML
// pipeline; call it on a pipeline built in C++ the same way.
//
//   std::vector<Doc> docs = load_docs();
//   Pipeline p = Pipeline::Builder()
//                    .source(from_range(docs, {.name = "docs-v3"}))
//                    .shuffle({})
//                    .map(map_value<Doc>([](Doc& d) { lower_case(d.text); }), {.name = "lower"})
//                    .batch({.size = 32})
//                    .map_batch(to_fields, {.name = "to_fields"})  // so the digest sees them
//                    .build();
//   VerifyReport r = verify(p, {.steps = 200, .trials = 5, .epochs = 2});
//   if (!r.ok()) std::fputs(r.summary().c_str(), stderr);
//
// The digest is Batch::digest: it covers the batch's fields, not Batch::user. Values that
// live only in Batch::user (from_range's collated values) are compared through their
// BatchInfo alone; copy them into a field with a map_batch to have them compared too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/params.h"
#include "flowstate/tools/mix_weights.h"

namespace flowstate {

/// What verify runs.
struct VerifyOptions {
  /// Batches of the reference run (>= 1); fewer when the pipeline ends sooner.
  std::uint64_t steps = 0;
  /// Restores to check (>= 1), at distinct restore points; at most one per point in
  /// [0, reference batches], so a short run gets fewer.
  int trials = 5;
  /// Seed choosing the restore points: the same seed checks the same points.
  std::uint64_t seed = 1;
  /// LoaderOptions::epochs of every run; unset: LoaderOptions' default (1).
  std::optional<std::uint64_t> epochs;
  /// Workers of the reference run and of the run that writes the checkpoints (>= 1, or
  /// LoaderOptions::workers' auto and inline); unset: the pipeline's.
  std::optional<int> workers;
  /// Workers of the restored runs, in turn: trial t (1-based) uses
  /// restore_workers[(t - 1) % size]. Worker counts are free, so any must give the same
  /// batches. Not empty; each >= 1, or static_cast<int>(kInline) (-1: batches made on the
  /// calling thread, LoaderOptions::workers' inline).
  std::vector<int> restore_workers = {1, 3, 2, static_cast<int>(kInline)};
  /// Mix weights set while running (MixWeightsSchedule), the same in every run: the
  /// reference, the run that writes the checkpoints and each restored run.
  std::vector<MixWeightsAt> mix_weights;
  /// Called with each line of VerifyReport::summary() (without its newline) as soon as it is
  /// known, on the calling thread; unset: nothing is called.
  std::function<void(const std::string& line)> progress;
};

/// What verify compares of one batch.
struct VerifyBatch {
  std::uint64_t step = 0;            ///< BatchInfo::step
  std::uint64_t epoch = 0;           ///< BatchInfo::epoch
  std::uint64_t index_in_epoch = 0;  ///< BatchInfo::index_in_epoch
  bool is_last_in_epoch = false;     ///< BatchInfo::is_last_in_epoch
  std::uint64_t digest = 0;          ///< Batch::digest(): the fields, not Batch::user
  /// Equal in all five.
  bool operator==(const VerifyBatch&) const = default;
  /// "step 7 epoch 0 index 7 (last in epoch) digest 0123456789abcdef" (the mark only when
  /// is_last_in_epoch).
  std::string describe() const;
};

/// One batch that differs from the reference.
struct VerifyMismatch {
  /// 0: the run that wrote the checkpoints (it must repeat the reference up to each restore
  /// point); t >= 1: the restored run of trial t.
  int trial = 0;
  std::uint64_t batch = 0;         ///< position in the reference run (0-based)
  VerifyBatch expected;            ///< the reference batch
  std::optional<VerifyBatch> got;  ///< what the run delivered there; unset: no batch (it ended)
  /// The report line: "trial 2: batch 17: <got>, expected <expected>" ("rerun: ..." for
  /// trial 0; "no batch" / "the restored run ended" when nothing was delivered).
  std::string describe() const;
};

/// One restore.
struct VerifyTrial {
  int number = 0;                    ///< 1-based
  std::uint64_t restored_after = 0;  ///< batches consumed before the checkpoint was written
  std::string checkpoint;            ///< the restored checkpoint's directory name ("step-...")
  int workers = 0;                   ///< workers of the restored run
  std::uint64_t compared = 0;        ///< reference batches after the restore point
  std::uint64_t mismatches = 0;      ///< of them, how many differ (an early end counts once)
  /// The report line: "trial 2: checkpoint after 17 batches (step-000000000017), restored
  /// with 3 workers: 123 batches identical" (or ": N mismatches").
  std::string describe() const;
};

/// Everything verify found.
struct VerifyReport {
  std::vector<VerifyBatch> reference;      ///< the uninterrupted run, in order
  bool pipeline_ended = false;             ///< the pipeline ended before `steps` batches
  std::vector<VerifyTrial> trials;         ///< in the order run (by restore point)
  std::vector<VerifyMismatch> mismatches;  ///< in the order found
  /// True when every compared batch equals the reference.
  bool ok() const { return mismatches.empty(); }
  /// What `flowstate verify` prints on stdout, one line each ending in '\n': the reference
  /// run, the rerun's mismatches, then per trial its mismatches and its result.
  std::string summary() const;
};

/// Runs the check described in the file comment. Writes its checkpoints under a fresh
/// directory in the system temp dir, removed before it returns. Runs its Loaders one after
/// another on the calling thread; `pipeline` is only read. Throws ConfigError when the
/// options make no sense (steps 0, trials < 1, a worker count < 1 that is not auto or
/// inline, no restore_workers) or the pipeline delivers no batch; CheckpointError when the
/// directory cannot be created or a checkpoint just written does not verify; and what the Loader
/// throws (ConfigError, DataError, CheckpointError). A mismatch is not an error: it is in the
/// report.
VerifyReport verify(const Pipeline& pipeline, const VerifyOptions& options);

}  // namespace flowstate
