// The node model (DESIGN.md §4). The stateful part of a pipeline — sources, shard, shuffle,
// batch planning — is a chain of SpineNodes that move Refs in chunks and run serially. Each
// keeps a small versioned state struct; `snapshot()` copies it, `restore()` reads it back.
// Heavy, stateless work (reading records, maps, collation) runs in parallel on whole batches.
//
// Nodes do not know about TBB: the graph layer wires them into a tbb::flow::graph.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/ref.h"
#include "core/sample.h"
#include "core/state.h"

namespace flowstate {

/// One parameter of a node's canonical description. `free` parameters (worker counts,
/// prefetch depth, device) do not change the output and are left out of the fingerprint.
struct DescribedParam {
  std::string key;
  std::string value;  ///< canonical text form
  bool free = false;
};

/// A node's type and parameters, in a canonical order. The basis of fingerprints,
/// `flowstate validate` and the checkpoint mismatch messages.
struct NodeDescription {
  std::string type;
  std::vector<DescribedParam> params;
  /// "type(k=v, ...)"; free parameters only when `with_free`.
  std::string to_string(bool with_free = true) const;
};

/// size() of a node whose epoch length is only known once the epoch ends (a generator, a
/// filter, pack, mix). The batch planner then looks one batch ahead to set is_last_in_epoch.
inline constexpr std::uint64_t kUnknownSize = ~std::uint64_t{0};

/// The shortest text that reads back as `v` ("0.5", "1e-08"): canonical numbers in
/// descriptions.
std::string format_double(double v);

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

  /// Number of Refs this node emits in `epoch`, or kUnknownSize.
  virtual std::uint64_t size(std::uint64_t epoch) const = 0;
  /// True when `at` gives O(1) random access to this node's output.
  virtual bool indexed() const { return false; }
  /// The i-th Ref of `epoch` (requires indexed() and i < size(epoch)).
  virtual Ref at(std::uint64_t epoch, std::uint64_t i) const;

  /// Moves the cursor to the beginning of `epoch` (and the upstream's, where it streams).
  virtual void start_epoch(std::uint64_t epoch) = 0;
  /// Writes up to out.size() Refs; returns how many. Fewer than asked only at the epoch's end.
  virtual std::size_t pull(std::span<Ref> out) = 0;

  /// An immutable copy of the node's state.
  virtual std::shared_ptr<const NodeSnapshot> snapshot() const = 0;
  /// Loads a state written by snapshot()->save(); throws CheckpointError when invalid.
  virtual void restore(InArchive& ar) = 0;

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
  std::shared_ptr<const NodeSnapshot> snapshot() const override {
    return std::make_shared<StateSnapshot<State>>(state_);
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
  State state_{};
};

/// Random-access reading of a source's records. Thread-safe: called from parallel workers.
class RecordStore {
 public:
  virtual ~RecordStore() = default;
  /// Bytes per record when every record has the same size, else 0.
  virtual std::size_t record_bytes() const = 0;
  /// The bytes of one record; valid while the source lives.
  virtual std::span<const std::byte> record(const Ref& ref) const = 0;
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
};

/// Reads a Ref as the pipeline sees it at a node's position: the source's record with every
/// per-sample map before that node applied. Thread-safe.
class SampleReader {
 public:
  virtual ~SampleReader() = default;
  virtual void read(const Ref& ref, std::uint64_t epoch, Sample& sample) const = 0;
};

/// Epoch-wise pull of a node's upstream through random access: the Refs [begin, begin+n) of
/// an indexed upstream. Helper for nodes that map positions.
void require_indexed(const SpineNode& self, const SpineNode* upstream);

}  // namespace flowstate
