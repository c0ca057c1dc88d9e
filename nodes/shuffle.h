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
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
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
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
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
  BufferShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size);
  void connect(SpineNode* upstream) override;
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const BufferShuffleState& s) const override;
  void on_restored() override;

 private:
  /// Draws one position (advancing slots_/consumed_) for draw number `draw`.
  std::uint64_t draw(std::uint64_t draw);
  void reset_buffer(std::uint64_t epoch);

  std::uint64_t key_;
  std::uint64_t capacity_;
  // Live buffer (derived state: rebuilt from the key-frame on restore).
  std::vector<std::uint64_t> slots_;
  std::uint64_t consumed_ = 0;  ///< inputs moved into the buffer so far this epoch
  std::uint64_t epoch_key_ = 0;
  std::uint64_t n_ = 0;  ///< inputs in this epoch
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::BufferShuffleState, 1);
