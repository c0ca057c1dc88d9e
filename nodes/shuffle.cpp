#include "flowstate/nodes/shuffle.h"

#include <algorithm>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/rng.h"

namespace flowstate {

ShuffleMode parse_shuffle_mode(std::string_view s) {
  return parse_enum<ShuffleMode>(s, "shuffle.mode", "shuffle mode");
}

void ShuffleOptions::validate() const {
  if (mode == ShuffleMode::kGlobal && size != kDefaultBufferSize)
    throw ConfigError("size", "size applies only to mode: buffer (this shuffle is global)");
}

namespace {

std::string inspect_shuffle(InArchive& ar, const InspectContext& ctx) {
  if (ctx.param("mode") == "global") return inspect_fields<CursorState>(ar, ctx);
  BufferShuffleState s;
  ar(s);
  JsonObject j;
  j.add("epoch", s.epoch).add("draws", s.draws);
  if (s.keyframe) {
    j.add_raw("keyframe", JsonObject()
                              .add("draws", s.keyframe->draws)
                              .add("slots", std::uint64_t{s.keyframe->slots.size()})
                              .str());
  } else {
    j.add_raw("keyframe", "null");
  }
  return j.str();
}

}  // namespace

const NodeDef& shuffle_node() {
  static const NodeDef def = define_node<ShuffleOptions>(
      {.type = "shuffle",
       .phase = Phase::kSpine,
       .doc = "reorders the records, differently every epoch"},
      [](BuildContext& ctx, const ShuffleOptions& o) {
        const std::uint64_t key = hash_combine(ctx.key(), o.seed);
        if (o.mode == ShuffleMode::kGlobal)
          ctx.add(std::make_unique<GlobalShuffleNode>(ctx.name(), key));
        else
          ctx.add(std::make_unique<BufferShuffleNode>(ctx.name(), key, o.size));
      },
      inspect_shuffle);
  return def;
}

// ---- global ----

GlobalShuffleNode::GlobalShuffleNode(std::string name, std::uint64_t key)
    : StatefulSpineNode(std::move(name)), key_(key) {}

void GlobalShuffleNode::connect(SpineNode* upstream) {
  require_indexed(*this, upstream);
  upstream_ = upstream;
}

const FeistelPermutation& GlobalShuffleNode::permutation(std::uint64_t epoch) const {
  if (!perm_ || perm_epoch_ != epoch) {
    perm_ = std::make_unique<FeistelPermutation>(upstream_->size(epoch), hash_combine(key_, epoch));
    perm_epoch_ = epoch;
  }
  return *perm_;
}

Ref GlobalShuffleNode::at(std::uint64_t epoch, std::uint64_t i) const {
  return upstream_->at(epoch, permutation(epoch)(i));
}

void GlobalShuffleNode::start_epoch(std::uint64_t epoch) {
  state_ = {epoch, 0};
  permutation(epoch);
}

std::size_t GlobalShuffleNode::pull(std::span<Ref> out) {
  const auto& perm = permutation(state_.epoch);
  std::uint64_t n = perm.size();
  std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), n - state_.cursor));
  for (std::size_t j = 0; j < k; ++j) out[j] = upstream_->at(state_.epoch, perm(state_.cursor + j));
  state_.cursor += k;
  return k;
}

void GlobalShuffleNode::validate(const GlobalShuffleState& s) const {
  if (s.cursor > upstream_->size(s.epoch))
    throw CheckpointError(name(), "shuffle cursor " + std::to_string(s.cursor) + " is past the " +
                                      std::to_string(upstream_->size(s.epoch)) + " inputs");
}

void GlobalShuffleNode::on_restored() { permutation(state_.epoch); }

// ---- buffer ----

namespace {

bool get_varint(std::string_view in, std::size_t& pos, std::uint64_t& v) {
  v = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    if (pos >= in.size()) return false;
    auto b = static_cast<std::uint8_t>(in[pos++]);
    v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

// Key-frame encoding: draws, the input cursor at that point, then every slot as
// (cursor - 1 - position) in a varint. Recent inputs are small numbers.
const std::string& ShuffleKeyframe::encoded(std::uint64_t& cursor) const {
  std::call_once(once_, [&] {
    std::uint64_t c = 0;
    for (auto s : slots) c = std::max(c, s + 1);
    blob_.resize(slots.size() * 10);
    char* p = blob_.data();
    for (auto s : slots) {
      std::uint64_t v = c - 1 - s;
      while (v >= 0x80) {
        *p++ = static_cast<char>((v & 0x7F) | 0x80);
        v >>= 7;
      }
      *p++ = static_cast<char>(v);
    }
    blob_.resize(static_cast<std::size_t>(p - blob_.data()));
    blob_.shrink_to_fit();
    cursor_ = c;
  });
  cursor = cursor_;
  return blob_;
}

template <class Archive>
void BufferShuffleState::save(Archive& ar, std::uint32_t) const {
  ar(epoch, draws);
  bool has = keyframe != nullptr;
  ar(has);
  if (!has) return;
  std::uint64_t cursor = 0;
  const std::string& blob = keyframe->encoded(cursor);
  ar(keyframe->draws, cursor, static_cast<std::uint64_t>(keyframe->slots.size()), blob);
}

template <class Archive>
void BufferShuffleState::load(Archive& ar, std::uint32_t version) {
  require_state_version("BufferShuffleState", version, 1, "shuffle");
  ar(epoch, draws);
  bool has = false;
  ar(has);
  keyframe.reset();
  if (!has) return;
  auto kf = std::make_shared<ShuffleKeyframe>();
  if (version == 0) {
    // Version 0 keeps the key-frame as plain input positions (validate() checks them). It is
    // the migration path tested by tests/serialization/fixtures/shuffle-v0: a layout change
    // bumps the version and keeps a branch like this one for the old layout.
    ar(kf->draws);
    kf->slots.resize(static_cast<std::size_t>(load_bounded_size(ar)));
    for (auto& slot : kf->slots) ar(slot);
    keyframe = std::move(kf);
    return;
  }
  std::uint64_t cursor = 0, count = 0;
  std::string blob;
  ar(kf->draws, cursor, count);
  load_bounded(ar, blob);
  if (count > blob.size())
    throw CheckpointError("shuffle", "key-frame claims " + std::to_string(count) + " slots in " +
                                         std::to_string(blob.size()) + " bytes");
  kf->slots.reserve(count);
  std::size_t pos = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t d = 0;
    if (!get_varint(blob, pos, d) || d >= cursor)
      throw CheckpointError("shuffle", "key-frame slot " + std::to_string(i) + " is corrupt");
    kf->slots.push_back(cursor - 1 - d);
  }
  keyframe = std::move(kf);
}

template void BufferShuffleState::save(OutArchive&, std::uint32_t) const;
template void BufferShuffleState::load(InArchive&, std::uint32_t);

BufferShuffleNode::BufferShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size)
    : StatefulSpineNode(std::move(name)), key_(key), capacity_(buffer_size) {
  if (capacity_ == 0) throw ConfigError("shuffle.size", "buffer size must be greater than zero");
}

void BufferShuffleNode::connect(SpineNode* upstream) {
  require_indexed(*this, upstream);
  upstream_ = upstream;
}

void BufferShuffleNode::reset_buffer(std::uint64_t epoch) {
  n_ = upstream_->size(epoch);
  epoch_key_ = hash_combine(key_, epoch);
  consumed_ = std::min(capacity_, n_);
  slots_.resize(consumed_);
  for (std::uint64_t i = 0; i < consumed_; ++i) slots_[i] = i;
}

void BufferShuffleNode::start_epoch(std::uint64_t epoch) {
  state_ = {epoch, 0, nullptr};
  reset_buffer(epoch);
}

std::uint64_t BufferShuffleNode::draw(std::uint64_t k) {
  std::uint64_t j = bounded(philox64(epoch_key_, 0, k), slots_.size());
  std::uint64_t out = slots_[j];
  if (consumed_ < n_) {
    slots_[j] = consumed_++;
  } else {
    slots_[j] = slots_.back();
    slots_.pop_back();
  }
  return out;
}

std::size_t BufferShuffleNode::pull(std::span<Ref> out) {
  std::size_t k = 0;
  for (; k < out.size() && !slots_.empty(); ++k) {
    out[k] = upstream_->at(state_.epoch, draw(state_.draws));
    ++state_.draws;
    // A key-frame every `capacity_` draws bounds a restore's replay to fewer draws.
    if (state_.draws % capacity_ == 0 && !slots_.empty()) {
      auto kf = std::make_shared<ShuffleKeyframe>();
      kf->draws = state_.draws;
      kf->slots = slots_;
      // Encoded now, while its slots are hot, on the spine's thread: every state() until the
      // next key-frame reuses the bytes instead of encoding 16 Ki cold slots (~0.2 ms).
      std::uint64_t cursor = 0;
      kf->encoded(cursor);
      state_.keyframe = std::move(kf);
    }
  }
  return k;
}

void BufferShuffleNode::validate(const BufferShuffleState& s) const {
  std::uint64_t n = upstream_->size(s.epoch);
  if (s.draws > n)
    throw CheckpointError(name(), "shuffle draws " + std::to_string(s.draws) + " exceed the " +
                                      std::to_string(n) + " inputs");
  if (s.keyframe) {
    // After d draws the buffer holds min(capacity, n - d) positions: draw() picks among
    // them, so a key-frame holding another number (none at all, say) is corrupt.
    if (s.keyframe->draws > s.draws ||
        s.keyframe->slots.size() != std::min(capacity_, n - s.keyframe->draws))
      throw CheckpointError(name(), "shuffle key-frame does not fit this buffer");
    for (auto p : s.keyframe->slots)
      if (p >= n) throw CheckpointError(name(), "shuffle key-frame position out of range");
  }
}

void BufferShuffleNode::on_restored() {
  reset_buffer(state_.epoch);
  std::uint64_t from = 0;
  if (state_.keyframe) {
    slots_ = state_.keyframe->slots;
    from = state_.keyframe->draws;
    consumed_ = std::min(n_, std::min(capacity_, n_) + from);
  }
  for (std::uint64_t k = from; k < state_.draws; ++k) draw(k);
}

}  // namespace flowstate
