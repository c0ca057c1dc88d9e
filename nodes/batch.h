// `batch`: groups Refs into batches and plans them (the last stateful stage of the spine),
// then — in parallel, off the spine — gathers the records, applies per-sample maps and
// collates fixed-size fields into one contiguous [B, ...] tensor per field, written
// directly into its final (pooled) buffer.
//
// The planner knows each epoch's length before it starts, so `is_last_in_epoch` is set
// before a batch is handed out. Skipped steps (Loader::skip) are dropped here: their Refs are
// pulled but no record is read, and later batches keep their scheduled step numbers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/batch.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/rng.h"
#include "nodes/node.h"

namespace flowstate {

/// Options of the `batch` node.
struct BatchOptions {
  std::uint64_t size = 0;  ///< samples per batch; required, > 0
  bool drop_last = false;  ///< drop a short last batch of each epoch
  NodeDescription describe() const;
};

/// Inclusive ranges of steps to drop, sorted and disjoint.
struct SkipRanges {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  bool contains(std::uint64_t step) const;
  /// Adds [first, last], merging with overlapping or adjacent ranges.
  void add(std::uint64_t first, std::uint64_t last);
  template <class Archive>
  void serialize(Archive& ar) {
    ar(ranges);
  }
};

/// A batch the spine has scheduled: its Refs and BatchInfo, not yet read.
struct BatchPlan {
  BatchInfo info;  ///< includes the Refs
  Stamp stamp;     ///< the spine's state right after this batch was scheduled
};

/// State of the batch planner.
struct BatchState {
  std::uint64_t epoch = 0;           ///< current epoch
  std::uint64_t step = 0;            ///< next step to schedule (global)
  std::uint64_t index_in_epoch = 0;  ///< next index to schedule in the epoch
  bool started = false;              ///< the epoch's upstream has been started
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    if (version > 1)
      throw CheckpointError("state", "BatchState version " + std::to_string(version) +
                                         " is newer than this build's 1; upgrade flowstate");
    ar(epoch, step, index_in_epoch, started);
  }
};

/// The batch planner: the spine's last node.
class BatchPlanner final : public StatefulSpineNode<BatchState> {
 public:
  BatchPlanner(std::string name, BatchOptions options);

  /// Stops after `epochs` epochs; 0 runs forever.
  void set_epochs(std::uint64_t epochs) { epochs_ = epochs; }
  void set_skips(SkipRanges skips) { skips_ = std::move(skips); }
  const BatchOptions& options() const { return options_; }

  /// Schedules the next batch that is not skipped; nullopt after the last epoch.
  std::optional<BatchPlan> next();
  /// Scheduled batches in `epoch`.
  std::uint64_t batches_in_epoch(std::uint64_t epoch) const;

  // SpineNode: the planner emits batches, not Refs; these describe its input.
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 private:
  std::uint64_t batch_samples(std::uint64_t epoch, std::uint64_t index) const;
  bool is_last_delivered(std::uint64_t epoch, std::uint64_t index, std::uint64_t step) const;

  BatchOptions options_;
  std::uint64_t epochs_ = 1;
  SkipRanges skips_;
  std::vector<Ref> scratch_;
};

/// A per-sample transform: may change, add or remove fields. `rng` is the element's own
/// counter-based generator, keyed by (pipeline seed, node, epoch, record).
struct MapContext {
  std::uint64_t epoch = 0;
  ElementRng rng;
};
using SampleFn = std::function<void(Sample&, MapContext&)>;
/// A per-batch transform (runs on the collated batch).
using BatchFn = std::function<void(Batch&, MapContext&)>;

/// A sample map as the assembler runs it.
struct SampleStage {
  std::string name;
  std::uint64_t key = 0;  ///< node key for the element generator
  SampleFn fn;
};
/// A batch map as the assembler runs it.
struct BatchStage {
  std::string name;
  std::uint64_t key = 0;
  BatchFn fn;
};

/// Turns plans into batches: stateless, thread-safe, runs on parallel workers.
class BatchAssembler {
 public:
  BatchAssembler(const RecordStore* store, std::string source_name,
                 std::vector<SampleStage> sample_stages, std::vector<BatchStage> batch_stages,
                 std::shared_ptr<BufferPool> pool);
  /// Reads, maps and collates one planned batch. Errors carry the failing node's name.
  Batch assemble(BatchPlan plan) const;

 private:
  Batch gather(BatchPlan& plan) const;  // fast path: records straight into the batch buffer
  Batch collate(BatchPlan& plan, std::vector<Sample>& samples) const;

  const RecordStore* store_;
  std::string source_name_;
  std::vector<SampleStage> sample_stages_;
  std::vector<BatchStage> batch_stages_;
  std::shared_ptr<BufferPool> pool_;
};

/// The element generator's stream for a record in an epoch.
inline std::uint64_t element_stream(std::uint64_t epoch, const Ref& ref) {
  return philox64(epoch, ref.source, ref.index);
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::BatchState, 1);
