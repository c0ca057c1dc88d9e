// Loader: runs a Pipeline on a oneTBB flow graph and hands batches to the consumer.
//
//   Loader loader(pipeline, {.epochs = 2});
//   for (const Batch& b : loader) train(b);
//   std::string s = loader.state();   // resume point: after the last batch received
//   Loader again(pipeline);  again.load_state(s);  // continues with the next batch, exactly
//
// The graph: a serial input node runs the spine (planning batches as Refs, stamping each with
// the spine's state) → a limiter_node bounds the batches in flight → a function_node with
// `workers` concurrency reads, maps and collates each batch into a pooled buffer → a
// sequencer_node restores order → a serial node applies device_copy and hands the batch to
// the consumer's queue. The consumer taking a batch releases a limiter slot. Nothing spins:
// the consumer waits on a condition variable, the graph on the limiter.
//
// Thread-safety: a Loader is used from one consumer thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "flowstate/core/batch.h"
#include "flowstate/graph/metrics.h"
#include "flowstate/graph/pipeline.h"
#include "flowstate/serialization/checkpoint.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate {

struct ListingMemo;

namespace detail {
struct LoaderObserver;
}

/// What a restore does with a state whose pipeline differs from this one only in data
/// parameters (a mix's weights or inputs; DescribedParam::data) or in the files a source's
/// glob matches (files added or removed; a file whose contents changed is refused). Any other
/// difference is refused either way.
enum class OnDataChange : std::uint8_t {
  kRefuse,    ///< refuse it, naming what differs (the default)
  kContinue,  ///< continue by each changed node's rule (docs/DECISIONS.md), recorded in the state
};

/// Run parameters of a Loader. None of them changes the batches produced.
struct LoaderOptions {
  std::uint64_t epochs = 1;  ///< epochs to run; 0 runs forever
  /// Overrides the pipeline's batch-assembly workers; kAuto (0): picked and adjusted while
  /// running (graph/autotune.h); static_cast<int>(kInline) (-1): made on the consumer's thread
  /// in next(), no read-ahead (Pipeline::Builder::workers).
  std::optional<int> workers;
  /// Overrides the pipeline's prefetch depth; kAuto (0): picked and adjusted while running.
  std::optional<std::size_t> prefetch;
  /// Bytes the batches in flight ((workers + prefetch depth) × batch bytes) may take while
  /// the workers or the depth are tuned (`auto`); 0: an eighth of the machine's memory.
  std::uint64_t memory_budget = 0;
  /// Seconds between two decisions of the autotuner (with `auto` workers or depth).
  double autotune_interval_s = 0.05;
  /// Per-node accounting (LoaderStats::nodes; graph/node_stats.h). On by default and meant to
  /// stay on; off only to measure what it costs (LoaderStats::nodes is then empty; the stage
  /// counters stay, and so does the trace's consumer track).
  bool node_stats = true;
  /// The job's ranks (core/coordinator.h), or null for a process on its own. With one,
  /// save_checkpoint(_async) and restore are collective: every rank calls them at the same
  /// steps, and a checkpoint is one step-N holding every rank's part, committed for all at
  /// once (serialization/checkpoint.h).
  std::shared_ptr<Coordinator> coordinator;
  /// Writes a timeline of the run to this file (Chrome trace-event JSON; graph/trace.h) when
  /// not empty. Closed when the Loader is destroyed.
  std::string trace;
  /// Appends a JSON line of metrics (graph/metrics.h) to this file every metrics_interval_s,
  /// when not empty.
  std::string metrics;
  /// Called with each metrics sample, on the consumer's thread inside next() (and once more
  /// from the Loader's destructor, for what happened since the last sample).
  std::function<void(const MetricsSample&)> on_metrics;
  /// Seconds between metrics samples. A sample is taken by next(), so a consumer that
  /// stops calling it gets none meanwhile.
  double metrics_interval_s = 1.0;
  /// A restore (load_state, restore) of a state saved with other data parameters, or over
  /// files added to or removed from a source's glob: refused, or continued by the changed
  /// nodes' rules (OnDataChange).
  OnDataChange on_data_change = OnDataChange::kRefuse;
  /// The job's checkpoint directory, when known as the sources open: remote sources save the
  /// listing of each `s3://` / `http(s)://` pattern in its `listings/`, and a Loader made again
  /// on it (a resume) reads that listing instead of listing the store again — unless
  /// `on_data_change` is kContinue, which lists afresh (and saves) so that the restore sees
  /// objects added, removed or changed. With a `coordinator`, rank 0 lists (or reads) and
  /// hands the listing to the other ranks. Empty: each Loader lists once (its rebuilds do not).
  /// Does not change the batches; save_checkpoint and restore still take their directory.
  std::string checkpoint_dir;
  /// The job's default cache directory for remote objects (`flowstate run --cache-dir`): used by
  /// the sources that set no `cache.dir`, over FLOWSTATE_CACHE_DIR. Empty: the environment's.
  /// Does not change the batches (nodes/sources/remote_options.h).
  std::string cache_dir;
  /// The job's default cache limit in bytes (`--cache-limit`): used by the sources that set no
  /// `cache.limit`, over FLOWSTATE_CACHE_LIMIT. 0: the environment's.
  std::uint64_t cache_limit = 0;
};

/// Where time went in a running Loader, for finding the bottleneck. Counters accumulate over
/// the Loader's life (a load_state/skip/restore starts them again).
struct LoaderStats {
  /// One stage of the graph.
  struct Stage {
    std::string name;           ///< "spine", "assemble" (read+map+collate), "deliver", "consumer"
    std::uint64_t items = 0;    ///< messages processed
    std::uint64_t busy_ns = 0;  ///< time spent in the stage's bodies (summed over workers)
    int concurrency = 1;        ///< workers running the stage
  };
  std::vector<Stage> stages;
  /// One node of the pipeline (mix inputs' nodes are named "mix[0]/lines").
  struct Node {
    std::string name;           ///< "records", "shuffle", "map:augment" (see stats_name)
    std::string type;           ///< "map"
    std::string stage;          ///< where most of its work runs: "spine", "assemble", "deliver"
    int threads = 1;            ///< threads of that stage (the workers for "assemble")
    std::uint64_t calls = 0;    ///< pulls (spine) or batches (assembly, deliver)
    std::uint64_t items = 0;    ///< Refs out of its pulls, or samples it worked on
    std::uint64_t bytes = 0;    ///< bytes of what it made (records read, samples mapped, batches)
    std::uint64_t busy_ns = 0;  ///< its own time, summed over threads (all stages)
    std::uint64_t spine_ns = 0, assemble_ns = 0, deliver_ns = 0;  ///< busy_ns by stage
    /// Time waiting on its input: a spine node's time inside its upstream's pulls; for the
    /// assembly and deliver, the idle time of the stage's threads (nothing planned yet).
    std::uint64_t wait_input_ns = 0;
    /// Time waiting on its output: for spine nodes, the spine held back by the in-flight
    /// limit (every slot taken); the assembly and deliver never wait on their output.
    std::uint64_t wait_output_ns = 0;
  };
  std::vector<Node> nodes;
  /// Time since the graph started (0 before the first next()).
  std::uint64_t elapsed_ns = 0;
  /// Time the consumer spent outside next() (its own work between batches).
  std::uint64_t consumer_busy_ns = 0;
  std::size_t in_flight = 0;  ///< batches planned and not yet taken by the consumer
  /// next() calls that found no batch ready: the pipeline was slower than the consumer.
  std::uint64_t consumer_waits = 0;
  /// Time next() spent waiting for a batch.
  std::uint64_t consumer_wait_ns = 0;
  /// next() calls that found every in-flight slot filled with ready batches: the consumer
  /// was the bottleneck (the graph waited on its output).
  std::uint64_t graph_waits = 0;
  std::size_t in_flight_limit = 0;  ///< messages (groups of batches) in flight at most
  /// Graph messages so far: cheap batches travel several to a message, so that the thread
  /// hand-offs do not cost more than the batches (docs/DECISIONS.md "The spine and the
  /// parallel stage"); a batch that costs more than ~500 µs travels alone.
  std::uint64_t messages = 0;
  /// Batch-assembly workers and prefetch depth now; with `auto` they are the tuner's latest
  /// choice (graph/autotune.h) and change while running.
  int workers = 0;
  std::size_t prefetch_depth = 0;
  bool workers_auto = false;           ///< the workers are tuned
  bool workers_inline = false;         ///< `workers: inline`: batches made in next()
  bool prefetch_auto = false;          ///< the prefetch depth is tuned
  std::uint64_t memory_budget = 0;     ///< the tuner's cap on bytes in flight (0: not tuning)
  std::uint64_t autotune_changes = 0;  ///< settings the tuner changed so far
};

/// Consumes a Pipeline. See the file comment.
class Loader {
 public:
  /// Opens the pipeline's sources (throws DataError / ConfigError). The graph starts on the
  /// first call to next().
  explicit Loader(Pipeline pipeline, LoaderOptions options = {});
  /// Stops the graph and returns promptly, also mid-epoch; batches in flight are dropped.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// The next batch, or nullopt after the last epoch. Rethrows a node's error (naming the
  /// node) once every batch before the failing one was delivered; after an error every call
  /// throws it again. Throws CheckpointError ("checkpoint '<dir>/step-N' failed: <what, with
  /// the system's reason>") once when an earlier save_checkpoint_async failed; no batch is
  /// taken by that call, and the next call goes on.
  std::optional<Batch> next();
  /// The consumer's stream for a batch copied to `device` (Loader::next(StreamFor)).
  using StreamFor = std::function<CudaStream(const Device& device)>;
  /// The same, with the stream handover instead of a host wait: a batch that device_copy
  /// moved to a CUDA device comes out with its copy possibly still running, the work queued
  /// on `stream` from now on ordered after it (cudaStreamWaitEvent), and `batch.fence` kept;
  /// the pool reuses its device buffers, once the batch and its tensors are dropped, only
  /// after the work `stream` had queued by then. So use the batch on `stream` (or call
  /// `batch.wait(other)` first) and never read its device memory from the host without
  /// `batch.wait()`. Same errors as next(), and a failed cudaStreamWaitEvent as device_copy's.
  std::optional<Batch> next(CudaStream stream);
  /// next(stream) with the stream picked per batch from its device (a Python consumer takes
  /// PyTorch's current stream on that device); `stream_for` runs only for batches on a device.
  std::optional<Batch> next(const StreamFor& stream_for);

  /// The state after the last batch returned by next() (or the initial/loaded state before
  /// the first), encoded. O(stamp): takes no lock on the graph and never stalls it.
  std::string state() const;
  /// The same, decoded.
  PipelineState state_struct() const;
  /// Continues from an encoded state: the next batch is the one after the state's last
  /// batch. Allowed at any time; batches in flight are discarded. Throws CheckpointError
  /// when the state is corrupt or was saved by a pipeline whose output differs (naming what
  /// differs).
  void load_state(std::string_view state);
  /// The same, with `on_change` instead of LoaderOptions::on_data_change.
  void load_state(std::string_view state, OnDataChange on_change);
  /// Drops the batches of steps [first, last] (inclusive) without reading their records;
  /// later batches keep their step numbers. Ranges merge with earlier ones and are part of
  /// the state. Throws ConfigError when first > last or when `first` was already delivered.
  void skip(std::uint64_t first, std::uint64_t last);
  /// Draws of mix node `node` use `weights` (one positive number per input) from the next
  /// step on; each input keeps its position. The weights in force are part of the state, and
  /// the change (its step, old and new weights) is recorded in data_changes(). Batches
  /// prepared ahead are discarded, as by skip(). Throws ConfigError when `node` is no mix of
  /// this pipeline or the weights do not fit it.
  void set_mix_weights(const std::string& node, const std::vector<double>& weights);
  /// The run's data changes, oldest first (continued restores, set_mix_weights), as in the
  /// state.
  const std::vector<DataChangeRecord>& data_changes() const { return data_changes_; }

  /// Writes the current state() as a checkpoint under `dir` (see serialization/checkpoint.h)
  /// named by the number of steps consumed; returns the committed directory. Only file I/O
  /// costs time (three fsyncs): the state is the last delivered batch's stamp. Refused
  /// (CheckpointError, nothing written) when `dir` holds a checkpoint that verifies with a
  /// higher step — another run's, further along, which a resume would prefer — unless
  /// `options.overwrite`; to start a run afresh in a used directory, remove_checkpoints(dir)
  /// first.
  std::string save_checkpoint(const std::string& dir,
                              const CheckpointWriteOptions& options = {}) const;
  /// The same, with the file I/O on another thread: the state is captured now; wait on (or
  /// get) the future before relying on the checkpoint. At most one async save of a Loader is
  /// in flight: a call while the previous one is still writing blocks until it has committed
  /// (saves asked for faster than the disk commits them slow the consumer down; none is
  /// dropped or coalesced). A failure is thrown by the future, and also once by the next
  /// next() or save_checkpoint_async call, whichever comes first.
  std::future<std::string> save_checkpoint_async(const std::string& dir,
                                                 CheckpointWriteOptions options = {}) const;
  /// Continues from the newest checkpoint under `dir` that verifies (with a coordinator: the
  /// newest whose part every rank verifies, the same step on every rank, or the same error on
  /// every rank) (see
  /// find_latest_checkpoint; LATEST is only a hint); returns what was loaded (path, step, and
  /// the newer checkpoints that were skipped, with reasons), or nullopt when `dir` is missing
  /// or holds no evidence of checkpoints (the loader is then unchanged). Throws
  /// CheckpointError when there is evidence — a LATEST, a step directory, an unfinished write
  /// of one — but nothing verifies (listing each with its reason), or when the newest valid
  /// one belongs to a pipeline whose output differs.
  std::optional<CheckpointFound> restore(const std::string& dir);

  /// Counters of the running graph (see LoaderStats). Cheap; callable between next() calls.
  LoaderStats stats() const;

  const Pipeline& pipeline() const { return pipeline_; }
  /// Step of the last delivered batch, if any.
  std::optional<std::uint64_t> last_step() const { return last_step_; }

  /// Input iterator over the remaining batches: `for (const Batch& b : loader)`.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;
    iterator() = default;
    explicit iterator(Loader* loader) : loader_(loader) { ++*this; }
    reference operator*() const { return *current_; }
    pointer operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = loader_->next();
      if (!current_) loader_ = nullptr;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(const iterator& o) const { return loader_ == o.loader_; }

   private:
    Loader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  class Runtime;
  class AsyncSaves;
  struct Metrics;
  /// next() (without `stream_for`) or next(stream_for).
  std::optional<Batch> next_batch(const StreamFor* stream_for);
  /// Takes a metrics sample (LoaderOptions::metrics, on_metrics) at `now` (stats_now_ns).
  void sample_metrics(std::int64_t now);
  /// Throws the error of a failed async save, once.
  void rethrow_failed_save();
  void rebuild(const PipelineState& state, const DataChange* change = nullptr);
  /// Rebuilds from `state` with `change` applied, recording it as `record` (plus what the
  /// nodes noted) in the history; a change that the nodes found to be none is not recorded.
  void rebuild_changed(PipelineState state, const DataChange& change, std::string record);
  /// The DataChange from a state of `before` to this pipeline; throws CheckpointError when
  /// anything but data parameters differs, or when they do and the options do not opt in.
  DataChange data_change_from(const std::vector<CanonicalParam>& before, OnDataChange on_change,
                              std::string& record) const;
  /// state_struct() without encoding the spine (the caller encodes the stamp later).
  PipelineState state_struct_without_spine() const;

  /// A new Runtime of the pipeline, its sources opened under this Loader's ListingContext.
  std::unique_ptr<Runtime> make_runtime();

  Pipeline pipeline_;
  LoaderOptions options_;
  std::vector<CanonicalParam> canonical_;
  std::uint64_t fingerprint_ = 0;
  /// Tracer and checkpoint timings, shared with checkpoint writer threads.
  std::shared_ptr<detail::LoaderObserver> observer_;
  /// The remote listings this Loader made (nodes/sources/remote_listing.h): its rebuilds
  /// reuse them.
  std::shared_ptr<ListingMemo> listings_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Runtime> runtime_;
  std::int64_t last_return_ns_ = 0;  ///< when next() last returned
  std::uint64_t consumer_busy_ns_ = 0;
  Stamp last_stamp_;
  std::optional<std::uint64_t> last_step_;
  std::vector<DataChangeRecord> data_changes_;
  std::optional<std::uint64_t> last_epoch_;
  SkipRanges skips_;
  std::exception_ptr error_;
  bool finished_ = false;
  /// Created by the first save_checkpoint_async (the Loader is used from one thread).
  mutable std::shared_ptr<AsyncSaves> saves_;
};

}  // namespace flowstate
