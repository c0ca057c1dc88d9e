// `shuffle`: reorders Refs, re-keyed every epoch from (seed, node, epoch).
//
// `global` applies a per-epoch Feistel bijection to the positions: a perfect shuffle with
// O(1) state (epoch, cursor) and O(1) random access.
//
// `buffer` keeps a buffer of `size` positions; each output draws a slot with the counter-based
// generator (draw k of epoch e is a pure function of seed, node, e, k), emits it and refills
// the slot with the next input. Its state is the epoch, the number of draws, and a key-frame:
// the buffer's contents taken every `size` draws (shared, never copied per batch). A restore
// loads the key-frame and replays fewer than `size` draws — without reading any record —
// so resuming costs the same wherever the checkpoint was taken. Key-frames are stored as
// distances from the input cursor, in varints: about 2.5 bytes per slot.
//
// `buffer` after a forward-only source (a generator: from_producer, a Python iterable) is a
// StreamShuffleNode: the same seeded draws over a buffer of `size` Refs filled from the stream.
// Its key-frame (every `size` draws) holds the buffered inputs' positions plus the source's
// own state at a position no later than the oldest of them (the source's snapshots are taken
// every `size` inputs); an input older than 2 x `size` inputs is drawn next, so that position
// is never far back. A restore rewinds the source to that state and re-produces at most about
// four buffers' worth of items (usually three), keeping the buffered ones — nothing of the
// consumed epoch prefix. The cost is the source's: a source that resumes through save/load
// (state_dict) rewinds in O(1), one that replays re-runs its epoch up to that position.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "flowstate/core/permutation.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/sources/file_source.h"

namespace flowstate {

enum class ShuffleMode : std::uint8_t { kGlobal, kBuffer };
template <>
struct EnumNames<ShuffleMode> {
  static constexpr std::array<std::pair<ShuffleMode, const char*>, 2> values{
      {{ShuffleMode::kGlobal, "global"}, {ShuffleMode::kBuffer, "buffer"}}};
};
ShuffleMode parse_shuffle_mode(std::string_view s);

/// Options of the `shuffle` node.
struct ShuffleOptions {
  /// Buffer slots when `size` is not given.
  static constexpr std::uint64_t kDefaultBufferSize = 16384;

  ShuffleMode mode = ShuffleMode::kGlobal;  ///< global (Feistel) or buffer
  std::uint64_t size = kDefaultBufferSize;  ///< buffer mode: slots in the buffer, > 0
  std::uint64_t seed = 0;  ///< mixed with the pipeline seed; change it to get another order

  /// A size other than the default is an option of the buffer mode only: the C++ builder
  /// and YAML both refuse one on a global shuffle.
  void validate() const;

  static constexpr auto table() {
    using O = ShuffleOptions;
    return std::tuple{
        param("mode", &O::mode,
              {.doc = "global (a perfect per-epoch permutation) or buffer (a seeded shuffle "
                      "buffer)"}),
        param("size", &O::size,
              {.min = 1,
               .doc = "buffer mode: slots in the shuffle buffer",
               .describe_if = [](const O& o) { return o.mode == ShuffleMode::kBuffer; }}),
        param("seed", &O::seed,
              {.doc = "mixed with the pipeline seed; change it to get another order"}),
    };
  }
};

/// The `shuffle` node's definition.
const NodeDef& shuffle_node();

/// State of a global shuffle: the cursor in the epoch's permutation.
using GlobalShuffleState = CursorState;

/// The `global` shuffle. Needs a random-access upstream.
class GlobalShuffleNode final : public StatefulSpineNode<GlobalShuffleState> {
 public:
  /// `key` identifies the node: derived from the pipeline seed, the node's position and
  /// the option seed.
  GlobalShuffleNode(std::string name, std::uint64_t key);
  void connect(SpineNode* upstream) override;
  /// The upstream's size; kUnknownSize in an epoch with gone positions (see positions()).
  std::uint64_t size(std::uint64_t epoch) const override;
  std::uint64_t positions(std::uint64_t epoch) const override {
    return upstream_->positions(epoch);
  }
  bool indexed() const override { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const GlobalShuffleState& s) const override;
  void on_restored() override;

 private:
  const FeistelPermutation& permutation(std::uint64_t epoch) const;
  std::uint64_t key_;
  mutable std::unique_ptr<FeistelPermutation> perm_;  ///< cached for perm_epoch_
  mutable std::uint64_t perm_epoch_ = 0;
  mutable bool gaps_ = false;  ///< perm_epoch_ has gone positions (SpineNode::positions)
};

/// A key-frame of the buffer shuffle: the buffer after `draws` draws, as input positions.
/// Immutable once shared; every stamp until the next key-frame points at the same one.
struct ShuffleKeyframe {
  std::uint64_t draws = 0;
  std::vector<std::uint64_t> slots;

  /// The slots' varint encoding and the input cursor it is relative to (see
  /// BufferShuffleState::save), computed once and reused by every state() until the next
  /// key-frame. Thread-safe.
  const std::string& encoded(std::uint64_t& cursor) const;

 private:
  mutable std::once_flag once_;
  mutable std::string blob_;
  mutable std::uint64_t cursor_ = 0;
};

/// State of a buffer shuffle.
struct BufferShuffleState {
  std::uint64_t epoch = 0;
  std::uint64_t draws = 0;                          ///< Refs emitted in this epoch
  std::shared_ptr<const ShuffleKeyframe> keyframe;  ///< null: the epoch's initial buffer

  template <class Archive>
  void save(Archive& ar, std::uint32_t version) const;
  template <class Archive>
  void load(Archive& ar, std::uint32_t version);
};

/// The `buffer` shuffle. Needs a random-access upstream.
class BufferShuffleNode final : public StatefulSpineNode<BufferShuffleState> {
 public:
  /// `buffer_size` >= 1 (ShuffleOptions' table checks it).
  BufferShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size);
  void connect(SpineNode* upstream) override;
  /// The upstream's size; kUnknownSize in an epoch with gone positions (see positions()).
  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const BufferShuffleState& s) const override;
  void on_restored() override;

 private:
  /// Draws one position (advancing slots_/consumed_) for draw number `draw`.
  std::uint64_t draw(std::uint64_t draw);
  void reset_buffer(std::uint64_t epoch);
  /// Fills the epoch's first buffer, if reset_buffer left it to the first pull.
  void fill_buffer();

  std::uint64_t key_;
  std::uint64_t capacity_;
  // Live buffer (derived state: rebuilt from the key-frame on restore).
  std::vector<std::uint64_t> slots_;
  std::uint64_t consumed_ = 0;  ///< inputs moved into the buffer so far this epoch
  bool unfilled_ = false;       ///< slots_ is the epoch's first buffer, not yet filled
  std::uint64_t epoch_key_ = 0;
  std::uint64_t n_ = 0;  ///< inputs in this epoch
};

/// A key-frame of the stream shuffle: the buffer after `draws` draws (inputs by their order in
/// the epoch), and where the source must be rewound to rebuild it.
struct StreamKeyframe {
  std::uint64_t draws = 0;
  std::uint64_t consumed = 0;  ///< inputs moved into the buffer so far
  std::uint64_t base = 0;      ///< input the rewind starts at (<= every slot)
  std::string upstream;        ///< the source's saved state at `base`; empty: the epoch start
  std::vector<std::uint64_t> slots;
};

/// State of a stream shuffle.
struct StreamShuffleState {
  std::uint64_t epoch = 0;
  std::uint64_t draws = 0;                         ///< Refs emitted in this epoch
  std::uint64_t consumed = 0;                      ///< inputs moved into the buffer
  std::uint64_t pulled = 0;                        ///< inputs pulled from the source (>= consumed)
  std::shared_ptr<const StreamKeyframe> keyframe;  ///< null: the epoch's start

  template <class Archive>
  void save(Archive& ar, std::uint32_t version) const;
  template <class Archive>
  void load(Archive& ar, std::uint32_t version);
};

/// The `buffer` shuffle of a forward-only source (see the file comment). Must come right
/// after that source.
class StreamShuffleNode final : public StatefulSpineNode<StreamShuffleState> {
 public:
  /// `buffer_size` >= 1 (ShuffleOptions' table checks it).
  StreamShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size,
                    const RecordStore* store);
  void connect(SpineNode* upstream) override;
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const StreamShuffleState& s) const override;
  void on_restored() override;

 private:
  struct Input {
    std::uint64_t n = 0;  ///< position in the epoch's input
    Ref ref;
  };
  void reset(std::uint64_t epoch);
  /// Pulls the next input from the source into pending_ (in chunks that stop at multiples of
  /// the capacity, where the source's snapshot is taken); false at the epoch's end.
  bool next_input(Input& in);
  /// Tops the buffer up to its capacity.
  void fill();
  /// Removes and returns the buffered input of draw `k`.
  Input draw(std::uint64_t k);
  void keyframe();

  std::uint64_t key_;
  std::uint64_t capacity_;
  const RecordStore* store_;
  // Live buffer (derived state: rebuilt from the key-frame on restore).
  std::uint64_t epoch_key_ = 0;
  std::vector<Input> slots_;
  std::unordered_map<std::uint64_t, std::size_t> where_;  ///< input -> slot
  std::uint64_t oldest_ = 0;                              ///< no buffered input is older
  std::deque<Input> pending_;                             ///< pulled, not yet buffered
  bool ended_ = false;
  /// The source's snapshots at inputs that are multiples of the capacity.
  std::deque<std::pair<std::uint64_t, std::shared_ptr<const NodeSnapshot>>> marks_;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::BufferShuffleState, 1);
CEREAL_CLASS_VERSION(flowstate::StreamShuffleState, 1);
