// Node state and stamps (DESIGN.md §6). A stateful node keeps a small, plain, versioned state
// struct; `snapshot()` copies it into an immutable NodeSnapshot. A Stamp is the list of
// snapshots of every stateful node, taken when a batch was planned; when the consumer takes
// that batch, its stamp *is* the pipeline's state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cereal/archives/portable_binary.hpp>

namespace flowstate {

/// The archive node states are written to: cereal's portable binary (fixed endianness).
using OutArchive = cereal::PortableBinaryOutputArchive;
/// The archive node states are read from.
using InArchive = cereal::PortableBinaryInputArchive;

/// An immutable copy of one node's state. Thread-safe (immutable).
class NodeSnapshot {
 public:
  virtual ~NodeSnapshot() = default;
  /// Writes the state; the node's `restore` reads exactly what this writes.
  virtual void save(OutArchive& ar) const = 0;
};

/// A snapshot holding a copy of a node's state struct `S` (which has a cereal `serialize`).
template <class S>
class StateSnapshot final : public NodeSnapshot {
 public:
  explicit StateSnapshot(S state) : state_(std::move(state)) {}
  void save(OutArchive& ar) const override { ar(state_); }
  const S& state() const { return state_; }
  /// Replaces the state. Only for a snapshot no one else holds: one given back to the node's
  /// Recycler (core/recycle.h) and refilled for the next stamp.
  void assign(const S& state) { state_ = state; }
  /// The state, to complete after assign() or construction; the same rule.
  S& mutable_state() { return state_; }

 private:
  S state_;
};

/// The snapshots of every stateful node, in pipeline order, taken together. Immutable and
/// shared by every batch planned from the same cut.
struct StampData {
  std::vector<std::string> node_names;                         ///< one per snapshot
  std::vector<std::shared_ptr<const NodeSnapshot>> snapshots;  ///< pipeline order
};
using Stamp = std::shared_ptr<const StampData>;

/// Checks the version of a state struct being loaded: throws CheckpointError (on `where`)
/// "TYPE version V is newer than this build's SUPPORTED; upgrade flowstate" when it is newer.
void require_state_version(std::string_view type, std::uint32_t version, std::uint32_t supported,
                           const std::string& where = "state");

/// Reads a string written by cereal (size tag, then bytes), refusing a size above the
/// thread's read limit (see StateReadLimit) before allocating: a corrupt length field must
/// be an error, not a multi-gigabyte allocation.
void load_bounded(InArchive& ar, std::string& s);
/// Reads a cereal size tag, refusing one above the read limit.
std::uint64_t load_bounded_size(InArchive& ar);

/// Sets the largest size load_bounded accepts on this thread while it lives — normally the
/// size of the whole input being decoded. Default without one: 1 GiB.
class StateReadLimit {
 public:
  explicit StateReadLimit(std::uint64_t limit);
  ~StateReadLimit();
  StateReadLimit(const StateReadLimit&) = delete;
  StateReadLimit& operator=(const StateReadLimit&) = delete;
  static std::uint64_t current();

 private:
  std::uint64_t previous_;
};

/// Serializes a stamp: a marker, the node count, then per node an entry of its name and its
/// state as length-prefixed bytes — each state an archive of its own, carrying its struct's
/// version, so a reader that does not know a node type (the pipeline's description names
/// it) can still skip, show or check its entry.
std::string serialize_stamp(const StampData& stamp);

/// One node's entry in a serialized stamp.
struct StampEntry {
  std::string name;
  std::string bytes;  ///< the node's state: a portable-binary archive of its own
};

/// Writes the entries of `stamp` — the node count, then each node's name and state bytes —
/// to `ar`: a serialized stamp is a marker and these; a node holding other nodes (a mix's
/// inputs) nests them the same way in its own state.
void save_entries(OutArchive& ar, const StampData& stamp);
/// Reads what save_entries wrote; throws std::exception on truncated or corrupt bytes.
std::vector<StampEntry> load_entries(InArchive& ar);

/// The entries of a stamp written by serialize_stamp; nullopt for a stamp of the first
/// format (flowstate before the node API: the node count, then each node's name and state
/// in one shared archive), which only the nodes themselves can read, in order. Throws
/// std::exception on truncated or corrupt bytes (bounded by the read limit).
std::optional<std::vector<StampEntry>> parse_stamp(std::string_view bytes);

}  // namespace flowstate
