// The shuffle node's modes in one file (over 600 lines): global, buffer and the stream
// key-frames share the definition table, the epoch rules and the state checks a split would
// have to expose.
#include "flowstate/nodes/shuffle.h"

#include <algorithm>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>

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

/// True when the pipeline's source is forward-only: its buffer shuffle is a StreamShuffleNode
/// (a shuffle after such a source is one, and nothing can come between them).
bool after_a_stream(const InspectContext& ctx) {
  if (!ctx.pipeline_param) return false;
  const std::string resume = ctx.pipeline_param("iterable.resume");
  return resume == "save_load" || resume == "replay";
}

std::string inspect_stream_shuffle(InArchive& ar) {
  StreamShuffleState s;
  ar(s);
  JsonObject j;
  j.add("epoch", s.epoch).add("draws", s.draws).add("consumed", s.consumed).add("pulled", s.pulled);
  if (const auto& kf = s.keyframe) {
    j.add_raw("keyframe", JsonObject()
                              .add("draws", kf->draws)
                              .add("consumed", kf->consumed)
                              .add("base", kf->base)
                              .add("slots", std::uint64_t{kf->slots.size()})
                              .add("source_state_bytes", std::uint64_t{kf->upstream.size()})
                              .str());
  } else {
    j.add_raw("keyframe", "null");
  }
  return j.str();
}

std::string inspect_shuffle(InArchive& ar, const InspectContext& ctx) {
  if (ctx.param("mode") == "global") return inspect_fields<CursorState>(ar, ctx);
  if (after_a_stream(ctx)) return inspect_stream_shuffle(ar);
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
       .doc = "reorders the records, differently every epoch",
       // A buffer shuffle's key-frame holds upstream positions (a stream's: the upstream's
       // saved state, replayed on restore).
       .holds_upstream = UpstreamHold::kReplay},
      [](BuildContext& ctx, const ShuffleOptions& o) {
        std::uint64_t key = hash_combine(ctx.key(), o.seed);
        // After a per-rank shard every rank shuffles its own records with a key of its own:
        // with one key, rank r's order would be rank 0's shifted by r at almost every position.
        if (auto rank = ctx.attribute("rank"))
          key = hash_combine(key, hash_combine(0x72616e6b, *rank));
        if (o.mode == ShuffleMode::kGlobal)
          ctx.add(std::make_unique<GlobalShuffleNode>(ctx.name(), key));
        else if (ctx.store() != nullptr && !ctx.store()->rereadable())
          ctx.add(std::make_unique<StreamShuffleNode>(ctx.name(), key, o.size, ctx.store()));
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
    // Over the upstream's positions: in an epoch that continues over files removed, the
    // removed files' positions keep their place in the permutation and are skipped (gone).
    const std::uint64_t n = upstream_->positions(epoch);
    perm_ = std::make_unique<FeistelPermutation>(n, hash_combine(key_, epoch));
    perm_epoch_ = epoch;
    gaps_ = n != upstream_->size(epoch);
  }
  return *perm_;
}

std::uint64_t GlobalShuffleNode::size(std::uint64_t epoch) const {
  const std::uint64_t n = upstream_->positions(epoch);
  // Gone positions are skipped: how many lie ahead is not counted.
  return n == upstream_->size(epoch) ? n : kUnknownSize;
}

Ref GlobalShuffleNode::at(std::uint64_t epoch, std::uint64_t i) const {
  return upstream_->at(epoch, permutation(epoch)(i));
}

void GlobalShuffleNode::start_epoch(std::uint64_t epoch) {
  // The upstream's epoch too (it is not pulled): a file source's state then names the epoch
  // its files were read in, which a change of its files needs (file_change.cpp).
  upstream_->start_epoch(epoch);
  state_ = {epoch, 0};
  permutation(epoch);
}

std::size_t GlobalShuffleNode::pull(std::span<Ref> out) {
  const auto& perm = permutation(state_.epoch);
  return pull_positions(out, state_.cursor, perm.size(), gaps_,
                        [&](std::uint64_t first, std::span<Ref> refs) {
                          // The run's images at once (their table lookups overlap), then the
                          // upstream's Refs.
                          thread_local std::vector<std::uint64_t> images;
                          images.resize(refs.size());
                          perm.images(first, images);
                          for (std::size_t j = 0; j < refs.size(); ++j)
                            refs[j] = upstream_->at(state_.epoch, images[j]);
                        });
}

void GlobalShuffleNode::validate(const GlobalShuffleState& s) const {
  const std::uint64_t n = upstream_->positions(s.epoch);
  if (s.cursor > n)
    throw CheckpointError(name(), "shuffle cursor " + std::to_string(s.cursor) + " is past the " +
                                      std::to_string(n) + " inputs");
}

void GlobalShuffleNode::on_restored() { permutation(state_.epoch); }

// ---- buffer ----

namespace {

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

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

/// The `count` slots of a key-frame's blob, each stored as (cursor - 1 - position) in a
/// varint: positions below `cursor`. Throws CheckpointError for a blob that is not that.
std::vector<std::uint64_t> decode_slots(std::string_view blob, std::uint64_t count,
                                        std::uint64_t cursor) {
  // Every varint takes at least a byte: a corrupt count must not allocate more than the blob.
  if (count > blob.size())
    throw CheckpointError("shuffle", "key-frame claims " + std::to_string(count) + " slots in " +
                                         std::to_string(blob.size()) + " bytes");
  std::vector<std::uint64_t> slots;
  slots.reserve(count);
  std::size_t pos = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t d = 0;
    if (!get_varint(blob, pos, d) || d >= cursor)
      throw CheckpointError("shuffle", "key-frame slot " + std::to_string(i) + " is corrupt");
    slots.push_back(cursor - 1 - d);
  }
  return slots;
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
  kf->slots = decode_slots(blob, count, cursor);
  keyframe = std::move(kf);
}

template void BufferShuffleState::save(OutArchive&, std::uint32_t) const;
template void BufferShuffleState::load(InArchive&, std::uint32_t);

BufferShuffleNode::BufferShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size)
    : StatefulSpineNode(std::move(name)), key_(key), capacity_(buffer_size) {}

void BufferShuffleNode::connect(SpineNode* upstream) {
  require_indexed(*this, upstream);
  upstream_ = upstream;
}

std::uint64_t BufferShuffleNode::size(std::uint64_t epoch) const {
  const std::uint64_t n = upstream_->positions(epoch);
  return n == upstream_->size(epoch) ? n : kUnknownSize;  // gone positions are skipped
}

void BufferShuffleNode::reset_buffer(std::uint64_t epoch) {
  // Over the upstream's positions (some gone in an epoch that continues over files removed:
  // drawn like any other, and passed over).
  n_ = upstream_->positions(epoch);
  epoch_key_ = hash_combine(key_, epoch);
  consumed_ = std::min(capacity_, n_);
  // The epoch's first buffer is [0, consumed_): filled by the first pull (fill_buffer), so a
  // shuffle that is started but never pulled — most inputs of a mix of thousands — holds none.
  slots_.clear();
  unfilled_ = true;
}

void BufferShuffleNode::fill_buffer() {
  if (!unfilled_) return;
  unfilled_ = false;
  slots_.resize(consumed_);
  for (std::uint64_t i = 0; i < consumed_; ++i) slots_[i] = i;
}

void BufferShuffleNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);  // as GlobalShuffleNode::start_epoch
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
  fill_buffer();
  std::size_t k = 0;
  while (k < out.size() && !slots_.empty()) {
    out[k] = upstream_->at(state_.epoch, draw(state_.draws));
    if (!out[k].is_gone()) ++k;  // a gone position is drawn, and passed over
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
  std::uint64_t n = upstream_->positions(s.epoch);
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
    unfilled_ = false;
    slots_ = state_.keyframe->slots;
    from = state_.keyframe->draws;
    consumed_ = std::min(n_, std::min(capacity_, n_) + from);
  }
  if (state_.draws > from) fill_buffer();
  for (std::uint64_t k = from; k < state_.draws; ++k) draw(k);
}

}  // namespace flowstate

// ---- stream ----

namespace flowstate {

// Layout: epoch, draws, consumed, pulled, a flag, then the key-frame: draws, consumed, base,
// the source's state bytes, the slot count and the slots as varints of (consumed - 1 - slot).
template <class Archive>
void StreamShuffleState::save(Archive& ar, std::uint32_t) const {
  ar(epoch, draws, consumed, pulled);
  bool has = keyframe != nullptr;
  ar(has);
  if (!has) return;
  std::string blob;
  for (auto s : keyframe->slots) put_varint(blob, keyframe->consumed - 1 - s);
  ar(keyframe->draws, keyframe->consumed, keyframe->base, keyframe->upstream,
     static_cast<std::uint64_t>(keyframe->slots.size()), blob);
}

template <class Archive>
void StreamShuffleState::load(Archive& ar, std::uint32_t version) {
  require_state_version("StreamShuffleState", version, 1, "shuffle");
  ar(epoch, draws, consumed, pulled);
  bool has = false;
  ar(has);
  keyframe.reset();
  if (!has) return;
  auto kf = std::make_shared<StreamKeyframe>();
  std::uint64_t count = 0;
  std::string blob;
  ar(kf->draws, kf->consumed, kf->base);
  load_bounded(ar, kf->upstream);
  ar(count);
  load_bounded(ar, blob);
  kf->slots = decode_slots(blob, count, kf->consumed);
  keyframe = std::move(kf);
}

template void StreamShuffleState::save(OutArchive&, std::uint32_t) const;
template void StreamShuffleState::load(InArchive&, std::uint32_t);

StreamShuffleNode::StreamShuffleNode(std::string name, std::uint64_t key, std::uint64_t buffer_size,
                                     const RecordStore* store)
    : StatefulSpineNode(std::move(name)), key_(key), capacity_(buffer_size), store_(store) {}

void StreamShuffleNode::connect(SpineNode* upstream) {
  if (upstream == nullptr || dynamic_cast<const RecordStore*>(upstream->underlying()) != store_)
    throw ConfigError(name(),
                      "a buffer shuffle of a forward-only source must come right after "
                      "that source: it rewinds the source to rebuild its buffer");
  upstream_ = upstream;
}

void StreamShuffleNode::reset(std::uint64_t epoch) {
  epoch_key_ = hash_combine(key_, epoch);
  slots_.clear();
  where_.clear();
  pending_.clear();
  marks_.clear();
  oldest_ = 0;
  ended_ = false;
}

void StreamShuffleNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_ = {epoch, 0, 0, 0, nullptr};
  reset(epoch);
}

bool StreamShuffleNode::next_input(Input& in) {
  if (pending_.empty()) {
    if (ended_) return false;
    // The source's state at a multiple of the capacity: where a later restore can rewind to.
    if (state_.pulled % capacity_ == 0 && state_.pulled > 0)
      marks_.emplace_back(state_.pulled, upstream_->snapshot());
    const std::uint64_t want = std::min<std::uint64_t>(std::min<std::uint64_t>(capacity_, 256),
                                                       capacity_ - state_.pulled % capacity_);
    std::vector<Ref> refs(static_cast<std::size_t>(want));
    const std::size_t got = upstream_->pull(refs);
    if (got < want) ended_ = true;
    for (std::size_t j = 0; j < got; ++j) pending_.push_back({state_.pulled++, refs[j]});
    if (pending_.empty()) return false;
  }
  in = pending_.front();
  pending_.pop_front();
  return true;
}

void StreamShuffleNode::fill() {
  Input in;
  while (slots_.size() < capacity_ && next_input(in)) {
    where_[in.n] = slots_.size();
    slots_.push_back(in);
    ++state_.consumed;
  }
}

StreamShuffleNode::Input StreamShuffleNode::draw(std::uint64_t k) {
  while (oldest_ < state_.consumed && !where_.contains(oldest_)) ++oldest_;
  // An input older than two buffers goes next: it bounds how far back a restore rewinds.
  const std::size_t j =
      state_.consumed - oldest_ > 2 * capacity_
          ? where_.at(oldest_)
          : static_cast<std::size_t>(bounded(philox64(epoch_key_, 0, k), slots_.size()));
  Input out = slots_[j];
  where_.erase(out.n);
  if (j + 1 != slots_.size()) {
    slots_[j] = slots_.back();
    where_[slots_[j].n] = j;
  }
  slots_.pop_back();
  return out;
}

void StreamShuffleNode::keyframe() {
  auto kf = std::make_shared<StreamKeyframe>();
  kf->draws = state_.draws;
  kf->consumed = state_.consumed;
  kf->slots.reserve(slots_.size());
  std::uint64_t first = state_.consumed;
  for (const Input& in : slots_) {
    kf->slots.push_back(in.n);
    first = std::min(first, in.n);
  }
  // The newest mark at or before every buffered input; older marks are no longer needed.
  while (marks_.size() > 1 && marks_[1].first <= first) marks_.pop_front();
  if (!marks_.empty() && marks_.front().first <= first) {
    kf->base = marks_.front().first;
    std::ostringstream os;
    {
      OutArchive ar(os);
      marks_.front().second->save(ar);
    }
    kf->upstream = os.str();
  }
  state_.keyframe = std::move(kf);
}

std::size_t StreamShuffleNode::pull(std::span<Ref> out) {
  std::size_t k = 0;
  while (k < out.size()) {
    fill();
    if (slots_.empty()) break;
    out[k++] = draw(state_.draws).ref;
    ++state_.draws;
    if (state_.draws % capacity_ == 0) keyframe();
  }
  return k;
}

void StreamShuffleNode::validate(const StreamShuffleState& s) const {
  const auto n = upstream_->size(s.epoch);
  if (s.draws > s.consumed || s.consumed > s.pulled || (n != kUnknownSize && s.pulled > n))
    throw CheckpointError(name(), "shuffle counters do not fit (draws " + std::to_string(s.draws) +
                                      ", consumed " + std::to_string(s.consumed) + ", pulled " +
                                      std::to_string(s.pulled) + ")");
  if (const auto& kf = s.keyframe) {
    if (kf->draws > s.draws || kf->consumed > s.consumed || kf->base > kf->consumed ||
        kf->slots.size() > capacity_ || kf->draws + kf->slots.size() != kf->consumed)
      throw CheckpointError(name(), "shuffle key-frame does not fit this buffer");
    for (auto p : kf->slots)
      if (p < kf->base || p >= kf->consumed)
        throw CheckpointError(name(), "shuffle key-frame position out of range");
  }
}

void StreamShuffleNode::on_restored() {
  const StreamShuffleState target = state_;
  reset(target.epoch);
  const StreamKeyframe* kf = target.keyframe.get();
  // Rewind the source to the key-frame's base (or the epoch's start) and re-produce up to
  // where the saved run had pulled.
  std::uint64_t base = 0;
  if (kf != nullptr && !kf->upstream.empty()) {
    base = kf->base;
    std::istringstream is(kf->upstream);
    InArchive ar(is);
    upstream_->restore(ar);
  } else {
    upstream_->start_epoch(target.epoch);
  }
  state_ = {target.epoch, 0, 0, base, nullptr};
  std::vector<Ref> dropped;
  if (kf != nullptr) {
    // Inputs before the key-frame's buffer that are not in it were drawn before it.
    std::unordered_map<std::uint64_t, std::size_t> slot_of;
    for (std::size_t j = 0; j < kf->slots.size(); ++j) slot_of[kf->slots[j]] = j;
    slots_.resize(kf->slots.size());
    Input in;
    for (std::uint64_t n = base; n < kf->consumed; ++n) {
      if (!next_input(in))
        throw CheckpointError(name(), "the source ended at input " + std::to_string(n) +
                                          " while the shuffle rebuilt its buffer: it yields "
                                          "fewer items than when the state was saved");
      auto it = slot_of.find(in.n);
      if (it == slot_of.end()) {
        dropped.push_back(in.ref);
      } else {
        slots_[it->second] = in;
        where_[in.n] = it->second;
      }
    }
    state_.draws = kf->draws;
    state_.consumed = kf->consumed;
    oldest_ = base;
  }
  for (std::uint64_t k = state_.draws; k < target.draws; ++k) {
    fill();
    if (slots_.empty())
      throw CheckpointError(name(), "the source ended before draw " + std::to_string(k) +
                                        " while the shuffle rebuilt its buffer");
    dropped.push_back(draw(k).ref);
    ++state_.draws;
    if (state_.draws % capacity_ == 0) keyframe();
  }
  // The same pulls in the same chunks as the saved run: the source is where it was.
  if (state_.consumed != target.consumed || state_.pulled != target.pulled)
    throw CheckpointError(name(), "the shuffle rebuilt its buffer to input " +
                                      std::to_string(state_.pulled) + ", not " +
                                      std::to_string(target.pulled) +
                                      ": the source yields other items than when the state was "
                                      "saved");
  state_.keyframe = target.keyframe;
  if (!dropped.empty()) store_->release(dropped);
}

}  // namespace flowstate
