// The node model (DESIGN.md §4). The stateful part of a pipeline — sources, shard, shuffle,
// batch planning — is a chain of SpineNodes that move Refs in chunks and run serially. Each
// keeps a small versioned state struct; `snapshot()` copies it, `restore()` reads it back.
// Heavy, stateless work (reading records, maps, collation) runs in parallel on whole batches.
//
// Nodes do not know about TBB: the graph layer wires them into a tbb::flow::graph.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <cereal/cereal.hpp>

#include "flowstate/core/recycle.h"
#include "flowstate/core/ref.h"
#include "flowstate/core/sample.h"
#include "flowstate/core/state.h"
#include "flowstate/nodes/description.h"

namespace flowstate {

/// size() of a node whose epoch length is only known once the epoch ends (a generator, a
/// filter, pack, mix). The batch planner then looks one batch ahead to set is_last_in_epoch.
inline constexpr std::uint64_t kUnknownSize = ~std::uint64_t{0};

/// What a node's state keeps of its upstream's output — what a data change upstream (a mix's
/// weights or inputs, DataChange) must leave intact for the node to continue exactly.
enum class UpstreamHold : std::uint8_t {
  kNothing,    ///< counters only (filter, map, batch)
  kPositions,  ///< addresses its upstream by position (shard's ranks): files removed
               ///< mid-epoch keep the positions, and it passes over gone ones
  kRefs,       ///< Refs of upstream items (pack's carry-over): the items they name must keep
               ///< their Refs (a mix keeps its inputs' numbers and removes none)
  kReplay,     ///< replays its upstream from a saved position (a stream shuffle's key-frame):
               ///< no change upstream continues exactly
};

/// What a restore that continues on changed data hands the nodes whose data parameters
/// (DescribedParam::data) differ from the state's, or were set while running
/// (Loader::set_mix_weights). The runtime has already refused every other difference.
struct DataChange {
  /// The checkpoint's canonical parameters ("node.key" -> text), as the state recorded them.
  std::map<std::string, std::string> before;
  /// Data parameters set while running ("node.key" -> canonical text), to take effect now.
  std::map<std::string, std::string> set;
  /// The nodes with something to change (their names).
  std::vector<std::string> nodes;
  /// The strongest hold of the nodes after them (before batch), and the first such node.
  UpstreamHold downstream = UpstreamHold::kNothing;
  std::string downstream_node;
  /// What the nodes did, one line each, for the run's history of data changes.
  mutable std::vector<std::string> notes;
  /// True when the restore may continue over files added to or removed from a file source's
  /// glob (the opt-in, OnDataChange::kContinue): a change of data identity, not of a declared
  /// parameter, which FileSource::restore reads through current().
  bool files = false;
  /// For each node of the pipeline (by name), the nodes after it (before batch) that hold
  /// something of their upstream (UpstreamHold other than kNothing), in order — what a file
  /// change of that node must continue through. A node not listed (one inside a mix's input)
  /// is not known here.
  std::map<std::string, std::vector<std::pair<UpstreamHold, std::string>>> holds_after;
  /// Per source id, how a file source whose files changed renumbers the Refs the checkpoint
  /// named (FileSource::continue_over_files sets it): the Ref numbered as the files opened now
  /// number it, or Ref::gone() for a record of a removed file. A node that holds Refs of its
  /// upstream (pack, UpstreamHold::kRefs) carries them over with it when it is restored after
  /// the source.
  mutable std::map<std::uint32_t, std::function<Ref(const Ref&)>> renumber;

  /// The DataChange of the restore running on this thread (restore_nodes sets it), or null.
  static const DataChange* current();

  /// Makes `change` the current() one of this thread while it lives.
  class Scope {
   public:
    explicit Scope(const DataChange* change);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const DataChange* previous_;
  };

  bool touches(const std::string& node) const {
    for (const auto& n : nodes)
      if (n == node) return true;
    return false;
  }
  /// The checkpoint's value of `node`.`key`; nullopt when it had none.
  std::optional<std::string> before_param(const std::string& node, const std::string& key) const {
    auto it = before.find(node + "." + key);
    if (it == before.end()) return std::nullopt;
    return it->second;
  }
  /// The value of `node`.`key` set while running; nullopt when none was.
  std::optional<std::string> set_param(const std::string& node, const std::string& key) const {
    auto it = set.find(node + "." + key);
    if (it == set.end()) return std::nullopt;
    return it->second;
  }
};

/// A serial, stateful stage of the spine. Pulls Refs from its upstream (null for a source).
/// Not thread-safe: the spine runs on one thread at a time.
class SpineNode {
 public:
  explicit SpineNode(std::string name) : name_(std::move(name)) {}
  virtual ~SpineNode() = default;
  SpineNode(const SpineNode&) = delete;
  SpineNode& operator=(const SpineNode&) = delete;

  /// The node's name in errors and checkpoints ("shuffle").
  const std::string& name() const { return name_; }
  /// Connects the upstream node; called once, before anything else. Throws ConfigError
  /// when this node cannot work on that upstream.
  virtual void connect(SpineNode* upstream) { upstream_ = upstream; }
  /// The node itself; a node the runtime puts in front of another (the per-node timing of
  /// graph/node_stats.cpp) returns the node it stands for, so a check of what the upstream
  /// is sees through it.
  virtual const SpineNode* underlying() const { return this; }

  /// Number of Refs this node emits in `epoch`, or kUnknownSize.
  virtual std::uint64_t size(std::uint64_t epoch) const = 0;
  /// The positions at() addresses in `epoch`: size(epoch), except in an epoch that continues
  /// over files removed mid-epoch (docs/DECISIONS.md "Files removed under shuffle, shard or
  /// pack"): its positions keep the epoch's numbering, at() answers Ref::gone() for those of
  /// a removed file's records, and size() counts what pull() delivers (kUnknownSize where
  /// that is not known). A node that addresses its upstream by position uses this range and
  /// skips gone positions.
  virtual std::uint64_t positions(std::uint64_t epoch) const { return size(epoch); }
  /// True when `at` gives O(1) random access to this node's output.
  virtual bool indexed() const { return false; }
  /// The i-th Ref of `epoch` (requires indexed() and i < positions(epoch)); Ref::gone() for a
  /// gone position (see positions()).
  virtual Ref at(std::uint64_t epoch, std::uint64_t i) const;

  /// Moves the cursor to the beginning of `epoch` (and the upstream's, where it streams).
  virtual void start_epoch(std::uint64_t epoch) = 0;
  /// Writes up to out.size() Refs; returns how many. Fewer than asked only at the epoch's end.
  virtual std::size_t pull(std::span<Ref> out) = 0;
  /// Writes the Refs the next pulls will return, as many as this node can tell (up to
  /// out.size()) without changing its state or what pull returns; 0 when it cannot tell. A
  /// node that is not indexed() but decides ahead (a filter over an indexed upstream) says
  /// here what it will pass on, so the node after it can read those records ahead (pack).
  virtual std::size_t upcoming(std::span<Ref> /*out*/) { return 0; }

  /// An immutable copy of the node's state.
  virtual std::shared_ptr<const NodeSnapshot> snapshot() const = 0;
  /// Copies the state into `snapshot` in place: one that this node's snapshot() made and no
  /// one else holds any more (a recycled stamp's: a stamp per planned batch then makes no new
  /// snapshot object). False when the node cannot; its caller then takes a new snapshot().
  virtual bool refill(NodeSnapshot& /*snapshot*/) const { return false; }
  /// Loads a state written by snapshot()->save(); throws CheckpointError when invalid.
  virtual void restore(InArchive& ar) = 0;
  /// Loads the state from a stamp of the first format, where every node read its state from
  /// one shared archive (see restore_nodes). Default: restore(ar).
  virtual void restore_legacy(InArchive& ar) { restore(ar); }
  /// Loads a state saved by this node with other values of its data parameters (see
  /// DataChange) and carries it over to the values it has now, by the node's documented rule;
  /// notes what it did in `change.notes`. Only nodes that declare data parameters are asked.
  /// Default: restore(ar).
  virtual void restore_changed(InArchive& ar, const DataChange& /*change*/) { restore(ar); }

 protected:
  SpineNode* upstream_ = nullptr;

 private:
  std::string name_;
};

/// A SpineNode whose whole state is the plain struct `State` (with a cereal `serialize`).
template <class State>
class StatefulSpineNode : public SpineNode {
 public:
  using SpineNode::SpineNode;
  /// A copy of state_ (completed by complete_snapshot); its memory is reused once every stamp
  /// holding it is dropped.
  std::shared_ptr<const NodeSnapshot> snapshot() const final {
    return snapshots_.get(
        [this] {
          auto s = std::make_unique<StateSnapshot<State>>(state_);
          complete_snapshot(s->mutable_state());
          return s;
        },
        [this](StateSnapshot<State>& s) { refill(s); });
  }
  bool refill(NodeSnapshot& snapshot) const final {
    // snapshot() above made it (final: no subclass makes another kind).
    auto& s = static_cast<StateSnapshot<State>&>(snapshot);
    s.assign(state_);
    complete_snapshot(s.mutable_state());
    return true;
  }
  void restore(InArchive& ar) override {
    State s;
    ar(s);
    validate(s);
    state_ = std::move(s);
    on_restored();
  }

 protected:
  /// Checks a loaded state before it is applied; throws CheckpointError.
  virtual void validate(const State&) const {}
  /// Rebuilds derived members after a restore.
  virtual void on_restored() {}
  /// Adds to a snapshot's copy of state_ what state_ does not keep up to date (a resumable
  /// producer's position, asked of the producer): every snapshot and refill goes through here.
  virtual void complete_snapshot(State& /*copy*/) const {}
  State state_{};

 private:
  /// The snapshots handed out, reused when given back: a stamp per planned batch allocates
  /// nothing for this node in steady state (bench/RESULTS.md, issue 26).
  mutable Recycler<StateSnapshot<State>> snapshots_;
};

class BufferPool;

/// A record's 1-D field as it lies in the store's memory (a mapped file): `bytes` hold
/// bytes.size() / dtype_size(dtype) elements and stay valid while the store lives.
struct RecordView {
  DType dtype = DType::kUInt8;
  std::span<const std::byte> bytes;
};

/// Random-access reading of a source's records. Thread-safe: called from parallel workers.
class RecordStore {
 public:
  virtual ~RecordStore() = default;
  /// Bytes per record when every record has the same size, else 0.
  virtual std::size_t record_bytes() const = 0;
  /// The bytes of one record: valid while the source lives, or, where stable_records() is
  /// false, until the calling thread's next record().
  virtual std::span<const std::byte> record(const Ref& ref) const = 0;
  /// True when record()'s bytes stay valid while the source lives (mapped files): a reader may
  /// look at records ahead of the one it copies (a prefetch). False when a record() may wait
  /// for a download and its bytes last until the thread's next read (a remote source reading
  /// by blocks through a cache smaller than its objects, nodes/sources/remote_blocks.h): then
  /// each record is read once, in order, as the reads planned for the cache counted them.
  virtual bool stable_records() const { return true; }
  /// Reads one record into `sample`'s fields (a copy: maps may modify it in place).
  virtual void read(const Ref& ref, Sample& sample) const = 0;
  /// The field a fixed-size record lands in when gathered straight into a batch.
  virtual FieldId record_field() const = 0;
  /// The pipeline is done with these Refs (their batch was assembled, or they were filtered
  /// out or skipped): a store that holds values for Refs in flight (a generator source, pack)
  /// drops them. Thread-safe. Each Ref is released at most once; stores that read from files
  /// ignore it.
  virtual void release(std::span<const Ref> /*refs*/) const {}
  /// True when any Ref can be read again later (files, ranges addressed by index); false
  /// when release() drops the only copy of a value (generators, pack rows).
  virtual bool rereadable() const { return true; }
  /// The 1-D field `field` of `ref`'s record where it lies in memory, in O(1) and without
  /// reading or copying it; nullopt when the store has no such view of that field (read()
  /// it). What pack and filter use to learn a document's length without reading it.
  virtual std::optional<RecordView> view(const Ref& /*ref*/, FieldId /*field*/) const {
    return std::nullopt;
  }
  /// view() of each of `refs` into `out` (as many): one call for a chunk of Refs, where a
  /// store can overlap their lookups (the indexed source prefetches every index entry of the
  /// chunk before reading any: on a shuffled order each is a cache miss). Default: view() one
  /// by one.
  virtual void views(std::span<const Ref> refs, FieldId field,
                     std::span<std::optional<RecordView>> out) const {
    for (std::size_t i = 0; i < refs.size(); ++i) out[i] = view(refs[i], field);
  }
  /// Writes the records of `refs` (Ref::record() of each) stacked into `fields`, with buffers
  /// from `pool`, exactly as reading each and stacking them would; false (and `fields`
  /// untouched) when the store has no such path. The assembler's one-copy path for stores
  /// whose records are assembled from pieces (pack's rows). Thread-safe.
  virtual bool gather(std::span<const Ref> /*refs*/, BufferPool& /*pool*/,
                      Fields& /*fields*/) const {
    return false;
  }
};

/// Reads a Ref as the pipeline sees it at a node's position: the source's record with every
/// per-sample map before that node applied. Thread-safe.
class SampleReader {
 public:
  virtual ~SampleReader() = default;
  virtual void read(const Ref& ref, std::uint64_t epoch, Sample& sample) const = 0;
  /// Hands back `sample`, what read() gave for `ref` in `epoch`, that the node goes on to
  /// pass downstream (a filter's kept samples): a reader further along the same maps may take
  /// it and apply only the maps in between, instead of reading the record through every map
  /// again (n filters between n maps: O(n) maps per sample, not O(n²)). May ignore it.
  virtual void pass_on(const Ref& /*ref*/, std::uint64_t /*epoch*/, Sample&& /*sample*/) const {}
};

/// Throws ConfigError unless `upstream` gives random access (`self` addresses it by position).
void require_indexed(const SpineNode& self, const SpineNode* upstream);

/// The stamp of `nodes` now: each node's name and snapshot. With `stamps`, the StampData comes
/// from there (reused once every holder has dropped it: a spine stamps every batch).
Stamp snapshot_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes,
                     Recycler<StampData>* stamps = nullptr);
/// Loads every node of `nodes` from a serialized stamp (either format, see parse_stamp):
/// the stamp must hold exactly these nodes, by name, in order. Throws CheckpointError
/// (on `where`) naming what does not fit.
/// With `change`, the nodes it touches are loaded by restore_changed.
void restore_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes, std::string_view bytes,
                   const std::string& where = "state", const DataChange* change = nullptr);
/// Loads every node of `nodes` from its entry (see load_entries), by name and in order.
void restore_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes,
                   const std::vector<StampEntry>& entries, const std::string& where,
                   const DataChange* change = nullptr);

/// The spine state of a sequential node (a source, shard, a global shuffle): where its
/// cursor is.
struct CursorState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  ///< Refs emitted in this epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("CursorState", version, 1);
    ar(epoch, cursor);
  }
  static constexpr auto inspect_fields() {
    return std::tuple{std::pair{"epoch", &CursorState::epoch},
                      std::pair{"cursor", &CursorState::cursor}};
  }
};

/// The body of a pull over an epoch's positions (shard, a global shuffle): fills `out` with
/// the Refs of positions `cursor`, `cursor + 1`, ... below `n`, `chunk(first, refs)` writing
/// the Refs of a run of positions from `first` at once. With `gaps`, gone positions (a removed
/// file's records) are passed over, the cursor counting them. Returns the Refs written.
template <class Chunk>
std::size_t pull_positions(std::span<Ref> out, std::uint64_t& cursor, std::uint64_t n, bool gaps,
                           Chunk&& chunk) {
  std::size_t k = 0;
  while (k < out.size() && cursor < n) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(out.size() - k, n - cursor));
    chunk(cursor, out.subspan(k, want));
    cursor += want;
    if (!gaps) return k + want;
    const std::size_t end = k + want;
    for (std::size_t j = k; j < end; ++j)
      if (!out[j].is_gone()) out[k++] = out[j];
  }
  return k;
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::CursorState, 1);
