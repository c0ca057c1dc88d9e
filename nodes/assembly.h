// Batch assembly, as the runtime drives it: the planner groups Refs into batches and plans
// them (the last stateful stage of the spine), then — in parallel, off the spine — the
// assembler gathers the records, applies per-sample maps and collates each field: stacked into
// one contiguous [B, ...] tensor written directly into its final (pooled) buffer, or padded /
// ragged for variable sizes, plus user values (Collate<T>). The `batch` node
// (nodes/batch.h) hands the runtime a planner; other nodes hand it the stages below
// (AssemblyStage), through BuildContext::add_stage (nodes/definition.h).
//
// `is_last_in_epoch` is set before a batch is handed out: from the epoch's length when the
// upstream knows it, else by looking one batch ahead (the stamp is cut before the look-ahead,
// so look-ahead Refs are never state). Skipped steps (Loader::skip) are dropped here: their
// Refs are pulled but no record is read, and later batches keep their scheduled step numbers.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/core/batch.h"
#include "flowstate/core/buffer.h"
#include "flowstate/core/error.h"
#include "flowstate/core/rng.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"

namespace flowstate {

/// How the `batch` node collates a field across samples.
enum class CollateMode : std::uint8_t {
  kStack,   ///< [B, ...]: every sample's field has the same dtype and shape
  kPad,     ///< [B, max_len, ...] padded with pad_value, plus "<field>_length" int64 [B]
  kRagged,  ///< values [sum_len, ...] plus "<field>_offsets" int64 [B + 1]
};
template <>
struct EnumNames<CollateMode> {
  static constexpr std::array<std::pair<CollateMode, const char*>, 3> values{
      {{CollateMode::kStack, "stack"},
       {CollateMode::kPad, "pad"},
       {CollateMode::kRagged, "ragged"}}};
};
/// "stack", "pad", "ragged".
std::string_view collate_mode_name(CollateMode mode);

/// Collates the samples' user values (Sample::user) into Batch::user — installed by
/// from_range() through Collate<T>. Runs on the parallel workers.
using UserCollateFn = std::function<void(std::vector<Sample>& samples, Batch& batch)>;

/// Options of the `batch` node.
struct BatchOptions {
  std::uint64_t size = 0;  ///< samples per batch; required, > 0
  bool drop_last = false;  ///< drop a short last batch of each epoch
  /// How tensor fields are collated. kPad and kRagged apply to `fields` (empty: every field
  /// of rank >= 1); other fields stack. Variable sizes run along each field's first dimension.
  CollateMode collate = CollateMode::kStack;
  std::vector<std::string> fields;  ///< the fields kPad / kRagged apply to
  double pad_value = 0;             ///< kPad: the value of padding elements
  /// User-value collation; unset: a batch of user values gets a std::vector<UserValue>.
  /// Not part of the description: name it through the source (from_range does).
  UserCollateFn user_collate;

  static constexpr auto table() {
    using O = BatchOptions;
    // Collation other than stack is described only when chosen, so fingerprints of pipelines
    // from before padded collation hold.
    constexpr auto not_stack = [](const O& o) { return o.collate != CollateMode::kStack; };
    return std::tuple{
        param("size", &O::size, {.min = 1, .required = true, .doc = "samples per batch"}),
        param("drop_last", &O::drop_last, {.doc = "drop a short last batch of each epoch"}),
        param("collate", &O::collate,
              {.doc = "stack (equal shapes), pad ([B, max_len, ...] + <field>_length) or ragged "
                      "(values + <field>_offsets)",
               .describe_if = not_stack}),
        param("fields", &O::fields,
              {.doc = "fields that pad / ragged apply to",
               .default_doc = "every field of rank >= 1",
               .describe_if = not_stack,
               .text = [](const O& o) { return "[" + join_list(o.fields) + "]"; }}),
        param("pad_value", &O::pad_value,
              {.doc = "pad: the value of padding elements",
               .describe_if = [](const O& o) { return o.collate == CollateMode::kPad; }}),
    };
  }
  /// fields and pad_value belong to pad and ragged collation.
  void validate() const;
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

/// A stage after `batch` that rewrites each planned batch in the spine, serially and in step
/// order, before the batch is stamped — e.g. shard after batch, which cuts every global batch
/// to this rank's slice. It keeps no state: the plan is a function of the batch.
struct PlanStage {
  std::string name;  ///< the node's, for errors
  /// What a plan stage may ask of the planner.
  struct Context {
    std::uint64_t batch_size = 0;  ///< the batch node's size (a short last batch has fewer Refs)
    /// Drops Refs the stage removes from the plan (a store may hold values for Refs in flight).
    std::function<void(std::span<const Ref>)> release;
  };
  /// Rewrites the plan: its Refs, num_samples and remainder (padding is counted afterwards).
  std::function<void(BatchInfo& info, const Context& ctx)> fn;
};

/// State of the batch planner.
struct BatchState {
  std::uint64_t epoch = 0;           ///< current epoch
  std::uint64_t step = 0;            ///< next step to schedule (global)
  std::uint64_t index_in_epoch = 0;  ///< next index to schedule in the epoch
  bool started = false;              ///< the epoch's upstream has been started
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("BatchState", version, 1);
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
  /// How a plan gets its stamp: the state of the whole spine at the moment it is called.
  /// The planner calls it right after a batch is scheduled and before it looks ahead.
  void set_snapshotter(std::function<Stamp()> snapshot) { snapshot_ = std::move(snapshot); }
  /// Adds a stage that rewrites every planned batch before its stamp (shard after batch).
  void add_plan_stage(PlanStage stage) { plan_stages_.push_back(std::move(stage)); }
  /// Where Refs the planner drops (skipped steps, a dropped short batch) are released.
  void set_store(const RecordStore* store) { store_ = store; }
  /// The source's collation of user values, when the batch options name none (from_range).
  void set_user_collate(UserCollateFn fn) { options_.user_collate = std::move(fn); }
  const BatchOptions& options() const { return options_; }

  /// Schedules the next batch that is not skipped; nullopt after the last epoch.
  std::optional<BatchPlan> next();
  /// Scheduled batches in `epoch` (requires a known upstream size).
  std::uint64_t batches_in_epoch(std::uint64_t epoch) const;

  // SpineNode: the planner emits batches, not Refs; these describe its input.
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 private:
  std::optional<BatchPlan> next_sized();
  /// For upstreams of unknown size: schedules the batch pulled by the previous call's
  /// look-ahead, stamps it, then pulls the next one to learn whether it was the last.
  std::optional<BatchPlan> next_unsized();
  /// Pulls the next delivered batch's Refs into ahead_, dropping skipped steps on the way.
  void look_ahead();
  bool ahead_ends_epoch() const {
    return ahead_.empty() || (options_.drop_last && ahead_.size() < options_.size);
  }
  void release(std::span<const Ref> refs) const {
    if (store_ != nullptr && !refs.empty()) store_->release(refs);
  }
  void on_restored() override { ahead_valid_ = false; }
  std::uint64_t batch_samples(std::uint64_t epoch, std::uint64_t index) const;
  bool is_last_delivered(std::uint64_t epoch, std::uint64_t index, std::uint64_t step) const;

  /// Runs the plan stages on a planned batch, then counts its padding.
  void finish(BatchInfo& info) const;

  BatchOptions options_;
  std::vector<PlanStage> plan_stages_;
  std::uint64_t epochs_ = 1;
  SkipRanges skips_;
  std::function<Stamp()> snapshot_;
  const RecordStore* store_ = nullptr;
  std::vector<Ref> scratch_;
  // Look-ahead (unknown sizes only). Not state: a stamp is taken before the look-ahead, so a
  // restored planner pulls the same Refs again.
  std::vector<Ref> ahead_;
  bool ahead_valid_ = false;
  bool epoch_had_refs_ = false;
};

/// The memory of one batch's stacked fields, offered to the per-sample maps while the batch is
/// assembled: a map that makes a fresh tensor for a field (output_tensor) may get the sample's
/// own slot of a [B, ...] buffer drawn from the batch's pool, and collation then takes that
/// buffer as the field's batch tensor instead of copying every sample into a new one.
///
/// Exactness does not depend on what the maps do afterwards: collation adopts the buffer only
/// when, for every sample i, the field's tensor still starts at slot i with the slot's dtype
/// and shape (its bytes are then the slot's bytes, whatever maps ran after the one that wrote
/// it); otherwise it copies, as without slots. Each field's buffer is adopted at most once.
/// Used by one thread: the one assembling the batch.
class BatchSlots {
 public:
  /// Slots for `batch_size` samples, in buffers from `pool`.
  BatchSlots(BufferPool& pool, std::size_t batch_size) : pool_(&pool), size_(batch_size) {}

  /// A tensor of `dtype` and `shape` for field `id` of the sample at `index` (< batch size):
  /// its slot when the field's first request had the same dtype and shape (the buffer is
  /// acquired then) and the slot was not handed out before, else a fresh tensor — so a map
  /// never gets, as its output, the slot its input lies in.
  Tensor tensor(FieldId id, DType dtype, const Shape& shape, std::size_t index);

  /// Field `id`'s buffer as a [B, ...] tensor when every sample's tensor of the field is its
  /// slot (see above); else an undefined tensor. Adopts a field's buffer at most once.
  Tensor adopt(FieldId id, const std::vector<Sample>& samples);

 private:
  struct Field {
    FieldId id = 0;
    DType dtype = DType::kUInt8;
    Shape shape;
    std::size_t bytes = 0;  ///< of one slot
    std::shared_ptr<Buffer> buffer;
    std::vector<bool> handed;  ///< per slot: handed out already
    bool adopted = false;
  };
  BufferPool* pool_;
  std::size_t size_;
  std::vector<Field> fields_;
};

/// A per-sample transform: may change, add or remove fields. `rng` is the element's own
/// counter-based generator, keyed by (pipeline seed, node, epoch, record).
struct MapContext {
  std::uint64_t epoch = 0;
  ElementRng rng;
  /// The batch's slots when the assembler runs the map (null elsewhere: a filter's look,
  /// tests), and the sample's index in the batch.
  BatchSlots* slots = nullptr;
  std::size_t index = 0;
};

/// A fresh tensor for a map to write field `id`'s new value into: the sample's slot of its
/// batch when the context offers one (BatchSlots), else a new allocation. Its contents are
/// undefined until written.
Tensor output_tensor(MapContext& ctx, FieldId id, DType dtype, Shape shape);
using SampleFn = std::function<void(Sample&, MapContext&)>;
/// Keeps a sample when it returns true. Must be thread-safe and deterministic in (sample,
/// generator).
using FilterFn = std::function<bool(const Sample&, MapContext&)>;
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

/// The per-sample maps of a chain since its store, in order, shared by every reader along it:
/// a reader holds the list and how many of its first stages lie before its node, so a chain of
/// n maps and n filters holds n stages, not one copy of the maps before each filter (n²).
using SharedSampleStages = std::shared_ptr<std::vector<SampleStage>>;

/// A store's records with per-sample maps applied: what the assembler reads, and what a
/// filter or pack sees at its position. Errors name the store or the failing map.
/// Thread-safe (the shared list is only appended to while the chain is built).
class MappedReader final : public SampleReader {
 public:
  MappedReader(const RecordStore* store, std::string store_name, std::vector<SampleStage> stages)
      : store_(store),
        store_name_(std::move(store_name)),
        stages_(std::make_shared<std::vector<SampleStage>>(std::move(stages))),
        count_(stages_->size()) {}
  /// Reads through the first `count` stages of `stages` (a chain's list, which may grow later).
  MappedReader(const RecordStore* store, std::string store_name, SharedSampleStages stages,
               std::size_t count)
      : store_(store),
        store_name_(std::move(store_name)),
        stages_(std::move(stages)),
        count_(count) {}
  void read(const Ref& ref, std::uint64_t epoch, Sample& sample) const override;
  /// Keeps `sample` for the reader that reads after this one (read_after), if any: at most
  /// kMaxPassed samples, all forgotten when that many were not taken (as after a restore or a
  /// shuffle buffer between the two): a miss only costs a full read.
  void pass_on(const Ref& ref, std::uint64_t epoch, Sample&& sample) const override;
  /// Makes read() start from what `prev` (a reader of the same store and stage list, with
  /// fewer stages or as many) passed on, where it holds the Ref.
  void read_after(MappedReader* prev);
  const RecordStore* store() const { return store_; }
  const std::string& store_name() const { return store_name_; }
  bool has_maps() const { return count_ != 0; }

  /// The most samples a reader keeps passed on and not yet taken.
  static constexpr std::size_t kMaxPassed = 1024;

 private:
  /// Moves the sample `ref` was passed on with in `epoch` into `sample`; false if none.
  bool take(const Ref& ref, std::uint64_t epoch, Sample& sample) const;

  const RecordStore* store_;
  std::string store_name_;
  SharedSampleStages stages_;
  std::size_t count_;
  const MappedReader* prev_ = nullptr;
  bool wanted_ = false;  ///< a later reader takes what this one passes on
  mutable std::mutex passed_mu_;
  mutable std::map<std::pair<std::uint64_t, Ref>, Sample> passed_;
};

/// True when `reader` reads `store`'s records as they are, with no per-sample map between them:
/// then the store's view of a record (RecordStore::view) is the sample that a node at the
/// reader's position (filter, pack, a mix input) sees.
inline bool reads_store_unmapped(const SampleReader* reader, const RecordStore* store) {
  const auto* mapped = dynamic_cast<const MappedReader*>(reader);
  return mapped != nullptr && !mapped->has_maps() && mapped->store() == store;
}

/// Where BatchAssembler::assemble spent one batch's time, stage by stage, for the runtime's
/// accounting and trace. Stages: 0 reading the store's records (with the fast path's gather
/// into the batch), 1..k the per-sample maps in order, k+1 collation (the batch node), then
/// the batch maps in order. A stage that did not run has items == 0 and ns == 0.
struct AssemblyTimes {
  struct Stage {
    std::uint64_t ns = 0;     ///< time in the stage (summed over the chunks of the batch)
    std::uint64_t items = 0;  ///< samples it worked on
    std::uint64_t bytes = 0;  ///< bytes it produced (read: record bytes)
  };
  std::int64_t begin_ns = 0;  ///< when the batch's assembly started (steady_clock)
  std::vector<Stage> stages;
};

/// Turns plans into batches: stateless, thread-safe, runs on parallel workers.
class BatchAssembler {
 public:
  /// `store` reads the Refs the spine plans (the source's, or the node that last replaced
  /// them, such as pack); `store_name` names it in errors; `options` says how to collate.
  BatchAssembler(const RecordStore* store, std::string store_name, BatchOptions options,
                 std::vector<SampleStage> sample_stages, std::vector<BatchStage> batch_stages,
                 std::shared_ptr<BufferPool> pool);
  /// Reads, maps and collates one planned batch. Errors carry the failing node's name. With
  /// `times`, records the time of each stage.
  Batch assemble(BatchPlan plan, AssemblyTimes* times = nullptr) const;
  /// Number of stages in AssemblyTimes: read, the sample maps, collate, the batch maps.
  std::size_t stage_count() const { return 2 + sample_stages_.size() + batch_stages_.size(); }
  /// The node names of the stages (the store's, each map's, "batch"'s), in AssemblyTimes order.
  std::vector<std::string> stage_names(const std::string& batch_name) const;

 private:
  void assemble_into(BatchPlan& plan, Batch& batch, AssemblyTimes* times) const;
  Batch gather(BatchPlan& plan) const;  // fast path: records straight into the batch buffer
  /// Collates the mapped samples; stacked fields the maps wrote into `slots` (when given)
  /// are adopted rather than copied.
  Batch collate(BatchPlan& plan, std::vector<Sample>& samples, BatchSlots* slots) const;
  /// The collate mode of field `id` whose first sample's tensor is `proto`.
  CollateMode mode_of(FieldId id, const Tensor& proto) const;

  const RecordStore* store_;
  std::string store_name_;
  std::vector<SampleStage> sample_stages_;
  BatchOptions options_;
  std::vector<BatchStage> batch_stages_;
  std::shared_ptr<BufferPool> pool_;
};

/// A stage that works on each assembled batch serially, in step order, as the runtime hands it
/// out (after the batch maps, before the consumer's queue): device_copy, or a node of one's own
/// that checks or tags every batch. Its time counts as the node's `deliver` stage. Called from
/// one thread at a time. What it hands out must be a function of the batch alone: a checkpoint
/// holds the spine's nodes, not the deliver stages, so a stage whose output depended on the
/// batches before it would not resume exactly.
class DeliverStage {
 public:
  virtual ~DeliverStage() = default;
  /// Where the assembler allocates batches this stage will get (device_copy: pinned staging
  /// buffers); null: the host pool. The first stage that has one decides.
  virtual std::shared_ptr<BufferPool> staging_pool() const { return nullptr; }
  /// Returns the batch as the next stage (or the consumer) gets it.
  virtual Batch deliver(Batch batch) = 0;
};

/// What a node from `batch` on hands the runtime (BuildContext::add_stage): any of these parts;
/// the runtime wires each where it runs. The runtime knows no node type: what a node does after
/// the samples is one of these.
struct AssemblyStage {
  /// Plans batches from the spine's Refs: the spine's last stateful node (the `batch` node).
  std::unique_ptr<BatchPlanner> planner;
  /// Rewrites every planned batch in the spine (shard after batch); needs a planner before it.
  std::function<void(BatchInfo&, const PlanStage::Context&)> plan;
  /// Works on every collated batch, on the parallel workers (a per-batch map).
  BatchFn batch;
  /// Works on every batch serially, in step order, as it is handed out (device_copy).
  std::shared_ptr<DeliverStage> deliver;
  /// Batches prepared ahead of the consumer (prefetch); the last node that sets it wins.
  std::optional<std::size_t> queue_depth;
};

/// The element generator's stream for a record in an epoch.
inline std::uint64_t element_stream(std::uint64_t epoch, const Ref& ref) {
  return philox64(epoch, ref.source, ref.index);
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::BatchState, 1);
