#include "flowstate/nodes/pack.h"

#include <algorithm>
#include <cstring>

namespace flowstate {

void PackOptions::validate() const {
  if (field.empty()) throw ConfigError("field", "pack needs a token field");
}

const NodeDef& pack_node() {
  static const NodeDef def = define_node<PackOptions>(
      {.type = "pack",
       .phase = Phase::kPerSample,
       .doc = "concatenates token sequences and cuts rows of exactly `length` tokens"},
      [](BuildContext& ctx, const PackOptions& o) {
        auto pack =
            std::make_unique<PackNode>(ctx.name(), o, ctx.reader(), ctx.store(), ctx.source_id());
        const RecordStore* store = pack.get();
        ctx.add_store(std::move(pack), store);
      },
      [](InArchive& ar, const InspectContext&) {
        PackState s;
        ar(s);
        JsonObject j;
        j.add("epoch", s.epoch).add("rows", s.rows).add("documents", s.documents);
        j.add_raw("carry", s.has_carry ? JsonObject()
                                             .add("record", s.carry.to_string())
                                             .add("tokens_used", s.carry_at)
                                             .str()
                                       : "null");
        return j.str();
      });
  return def;
}

PackNode::PackNode(std::string name, PackOptions options, const SampleReader* reader,
                   const RecordStore* upstream_store, std::uint32_t source_id)
    : StatefulSpineNode(std::move(name)),
      options_(std::move(options)),
      reader_(reader),
      upstream_store_(upstream_store),
      source_id_(source_id),
      field_(field_id(options_.field)) {
  if (options_.length == 0)
    throw ConfigError(this->name() + ".length", "pack length must be greater than zero");
  if (!upstream_store_->rereadable())
    throw ConfigError(this->name(),
                      "pack resumes by reading the document it stopped in again, and its "
                      "upstream cannot read a record twice (a generator source, or another "
                      "pack); use an indexed source");
}

std::uint64_t PackNode::size(std::uint64_t epoch) const {
  return upstream_->size(epoch) == 0 ? 0 : kUnknownSize;
}

void PackNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_ = PackState{.epoch = epoch};
  carry_tokens_ = Tensor();
  upstream_done_ = false;
}

void PackNode::on_restored() {
  upstream_done_ = false;
  carry_tokens_ = state_.has_carry ? read_document(state_.carry) : Tensor();
  if (state_.has_carry && state_.carry_at >= extent(carry_tokens_))
    throw CheckpointError("state", "pack '" + name() + "' resumes " +
                                       std::to_string(state_.carry_at) + " tokens into document " +
                                       state_.carry.to_string() + ", which has only " +
                                       std::to_string(extent(carry_tokens_)));
}

Tensor PackNode::read_document(const Ref& ref) {
  Sample s;
  reader_->read(ref, state_.epoch, s);
  const Tensor* t = s.find(field_);
  if (t == nullptr)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': record " + ref.to_string() + " has no field '" +
                        options_.field + "'");
  const DType d = t->dtype();
  const bool integer = d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kBool;
  if (t->shape().rank() != 1 || !integer)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': field '" + options_.field + "' of record " +
                        ref.to_string() + " is " + std::string(dtype_name(d)) +
                        t->shape().to_string() + "; pack needs 1-D integer tokens");
  if (dtype_ && *dtype_ != d)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': field '" + options_.field + "' of record " +
                        ref.to_string() + " is " + std::string(dtype_name(d)) +
                        ", earlier documents are " + std::string(dtype_name(*dtype_)));
  dtype_ = d;  // the spine's alone: rows carry their tokens' dtype to the workers
  const Ref one[] = {ref};
  upstream_store_->release(one);  // the tokens live on in `*t`; the store may drop its copy
  return *t;
}

std::size_t PackNode::pull(std::span<Ref> out) {
  std::size_t n = 0;
  while (n < out.size()) {
    std::vector<Segment> row;
    std::uint64_t need = options_.length;
    while (need > 0) {
      if (!state_.has_carry) {
        if (upstream_done_) break;
        Ref next;
        if (upstream_->pull({&next, 1}) == 0) {
          upstream_done_ = true;
          break;
        }
        carry_tokens_ = read_document(next);
        ++state_.documents;
        state_.carry = next;
        state_.carry_at = 0;
        state_.has_carry = extent(carry_tokens_) > 0;
        continue;
      }
      const std::uint64_t take = std::min(need, extent(carry_tokens_) - state_.carry_at);
      row.push_back({carry_tokens_, state_.carry_at, state_.carry_at + take});
      state_.carry_at += take;
      need -= take;
      if (state_.carry_at == extent(carry_tokens_)) {
        state_.has_carry = false;
        state_.carry_at = 0;
        state_.carry = Ref{};
        carry_tokens_ = Tensor();
      }
    }
    if (need == options_.length) break;  // nothing left in this epoch
    if (need > 0) {
      if (options_.drop_remainder) break;
      row.push_back({Tensor(), 0, need});
    }
    const Ref ref{source_id_, static_cast<std::uint32_t>(state_.epoch), state_.rows++};
    {
      std::lock_guard lock(mu_);
      rows_[{ref.shard, ref.index}] = std::move(row);
    }
    out[n++] = ref;
  }
  return n;
}

std::span<const std::byte> PackNode::record(const Ref&) const {
  throw Error("pack '" + name() + "' rows have no stored bytes; read them");
}

void PackNode::read(const Ref& ref, Sample& sample) const {
  std::vector<Segment> row;
  {
    std::lock_guard lock(mu_);
    auto it = rows_.find({ref.shard, ref.index});
    if (it == rows_.end())
      throw Error("pack '" + name() + "': row " + std::to_string(ref.index) + " of epoch " +
                  std::to_string(ref.shard) + " is not in flight");
    row = it->second;
  }
  // A row starts with tokens (padding only ever follows them), which give its dtype.
  const DType d = row.front().tokens.dtype();
  Tensor out(d, Shape{static_cast<std::int64_t>(options_.length)});
  auto* dst = static_cast<std::byte*>(out.data());
  const std::size_t es = dtype_size(d);
  auto put = [&](std::size_t at, std::uint64_t count, std::int64_t value) {
    visit_dtype(d, [&]<class T>() {
      const T v = static_cast<T>(value);
      for (std::uint64_t i = 0; i < count; ++i) std::memcpy(dst + (at + i) * es, &v, es);
    });
  };
  std::size_t at = 0;
  for (const Segment& seg : row) {
    if (!seg.tokens.defined()) {
      put(at, seg.end - seg.begin, options_.pad);
      at += seg.end - seg.begin;
      continue;
    }
    const auto numel = static_cast<std::uint64_t>(seg.tokens.numel());
    const std::uint64_t body_end = std::min(seg.end, numel);
    if (body_end > seg.begin) {
      std::memcpy(dst + at * es, static_cast<const std::byte*>(seg.tokens.data()) + seg.begin * es,
                  (body_end - seg.begin) * es);
      at += body_end - seg.begin;
    }
    if (seg.end > numel) {  // the separator closes this document
      put(at, 1, options_.separator);
      at += 1;
    }
  }
  sample.ref = ref;
  sample.set(field_, std::move(out));
}

void PackNode::release(std::span<const Ref> refs) const {
  std::lock_guard lock(mu_);
  for (const Ref& r : refs) rows_.erase({r.shard, r.index});
}

}  // namespace flowstate
