#include "flowstate/nodes/pack.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "flowstate/core/buffer.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/read_plan.h"

namespace flowstate {

void PackOptions::validate() const {
  if (field.empty()) throw ConfigError("field", "pack needs a token field");
}

const NodeDef& pack_node() {
  static const NodeDef def = define_node<PackOptions>(
      {.type = "pack",
       .phase = Phase::kPerSample,
       .doc = "concatenates token sequences and cuts rows of exactly `length` tokens",
       // Its rows replace the input's Refs, which a mix addresses by Ref::source.
       .placement = {.in_mix_input = false},
       // Its carry-over is the Ref of the document the next row starts in (carried over a
       // change of a source's files by DataChange::renumber).
       .holds_upstream = UpstreamHold::kRefs},
      [](BuildContext& ctx, const PackOptions& o) {
        const SampleReader* reader = ctx.reader();
        // No map between the store and pack: documents can be planned from store views.
        const bool direct = reads_store_unmapped(reader, ctx.store());
        auto pack = std::make_unique<PackNode>(ctx.name(), o, reader, ctx.store(), ctx.source_id(),
                                               direct, ctx.parallel_for());
        const RecordStore* store = pack.get();
        ctx.add_store(std::move(pack), store);
      },
      [](InArchive& ar, const InspectContext&) {
        PackState s;
        ar(s);
        JsonObject j;
        j.add("epoch", s.epoch).add("rows", s.rows).add("documents", s.documents);
        j.add("pending", static_cast<std::uint64_t>(s.pending_left()));
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
                   const RecordStore* upstream_store, std::uint32_t source_id, bool direct,
                   ParallelFor parallel)
    : StatefulSpineNode(std::move(name)),
      options_(std::move(options)),
      reader_(reader),
      upstream_store_(upstream_store),
      source_id_(source_id),
      direct_(direct),
      field_(field_id(options_.field)),
      ids_field_(field_id(options_.field + "_doc_ids")),
      parallel_(std::move(parallel)) {
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
  carry_doc_ = Document();
  upstream_done_ = false;
  pending_views_.clear();
  ahead_off_ = false;
  clear_ahead();
}

void PackNode::renumber(const DataChange& change) {
  auto now = [&](const Ref& ref) {
    auto it = change.renumber.find(ref.source);
    return it == change.renumber.end() ? ref : it->second(ref);
  };
  std::string skipped;
  if (state_.has_carry) {
    const Ref carry = now(state_.carry);
    if (carry.is_gone()) {
      // Its tokens up to carry_at were delivered; the rest lie in a file that is gone.
      skipped = "the rest of document " + state_.carry.to_string() + " (" +
                std::to_string(state_.carry_at) +
                " of its tokens delivered; the next row starts with the next document)";
      state_.has_carry = false;
      state_.carry = Ref{};
      state_.carry_at = 0;
    } else {
      state_.carry = carry;
    }
  }
  std::vector<Ref> kept;
  std::uint64_t gone = 0;
  for (std::size_t i = state_.pending_at; i < state_.pending.size(); ++i) {
    const Ref r = now(state_.pending[i]);
    if (r.is_gone())
      ++gone;
    else
      kept.push_back(r);
  }
  state_.pending = std::move(kept);
  state_.pending_at = 0;
  if (gone > 0)
    skipped += (skipped.empty() ? "" : " and ") + std::to_string(gone) + " document" +
               (gone == 1 ? "" : "s") + " pulled and not started";
  if (!skipped.empty())
    change.notes.push_back(name() + ": of files removed, " + skipped + " skipped in epoch " +
                           std::to_string(state_.epoch));
}

void PackNode::on_restored() {
  upstream_done_ = false;
  pending_views_.clear();  // the restored pending Refs are viewed one by one
  ahead_off_ = false;
  clear_ahead();
  // A restore over a source whose files changed: its Refs as the files now number them.
  if (const DataChange* change = DataChange::current(); change && !change->renumber.empty())
    renumber(*change);
  carry_doc_ = state_.has_carry ? load_document(state_.carry) : Document();
  if (state_.has_carry && state_.carry_at >= extent(carry_doc_))
    throw CheckpointError("state", "pack '" + name() + "' resumes " +
                                       std::to_string(state_.carry_at) + " tokens into document " +
                                       state_.carry.to_string() + ", which has only " +
                                       std::to_string(extent(carry_doc_)));
}

void PackNode::check_dtype(const Ref& ref, DType d, const Shape& shape) {
  const bool integer = dtype_is_integer(d);
  if (shape.rank() != 1 || !integer)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': field '" + options_.field + "' of record " +
                        ref.to_string() + " is " + std::string(dtype_name(d)) + shape.to_string() +
                        "; pack needs 1-D integer tokens");
  if (dtype_ && *dtype_ != d)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': field '" + options_.field + "' of record " +
                        ref.to_string() + " is " + std::string(dtype_name(d)) +
                        ", earlier documents are " + std::string(dtype_name(*dtype_)));
  dtype_ = d;  // the spine's alone: rows carry their tokens' dtype to the workers
  dtype_shift_ = static_cast<std::uint8_t>(std::countr_zero(dtype_size(d)));  // 1, 2, 4 or 8
}

PackNode::Document PackNode::load_document(const Ref& ref) {
  if (direct_) {
    if (auto view = upstream_store_->view(ref, field_)) return from_view(ref, *view);
  }
  Sample s;
  reader_->read(ref, state_.epoch, s);
  return from_read(ref, s.find(field_));
}

PackNode::Document PackNode::from_view(const Ref& ref, const RecordView& view) {
  // Only the length is needed now; the workers copy the tokens from where they lie.
  // A view is 1-D: once a document set the dtype, the check is that one comparison.
  if (!dtype_ || *dtype_ != view.dtype) [[unlikely]]
    check_dtype(ref, view.dtype,
                Shape{static_cast<std::int64_t>(view.bytes.size() / dtype_size(view.dtype))});
  Document doc;
  doc.numel = view.bytes.size() >> dtype_shift_;  // a shift, not a division per document
  doc.data = view.bytes.data();
  return doc;  // a view stays valid while the store lives: nothing to release
}

PackNode::Document PackNode::from_read(const Ref& ref, const Tensor* t) {
  if (t == nullptr)
    throw DataError("", DataError::kNoOffset,
                    "pack '" + name() + "': record " + ref.to_string() + " has no field '" +
                        options_.field + "'");
  check_dtype(ref, t->dtype(), t->shape());
  const Ref one[] = {ref};
  upstream_store_->release(one);  // the tokens live on in `*t`; the store may drop its copy
  Document doc;
  doc.owner = t->buffer();
  doc.data = static_cast<const std::byte*>(t->data());
  doc.numel = static_cast<std::uint64_t>(t->numel());
  return doc;
}

void PackNode::clear_ahead() {
  ahead_.clear();
  ahead_next_ = 0;
  ahead_size_ = 0;
}

bool PackNode::next_ref(Ref& next, std::uint64_t tokens) {
  if (state_.pending_left() == 0) {
    state_.pending.clear();
    state_.pending_at = 0;
    pending_views_.clear();
    if (upstream_done_) return false;
    // As many documents as `tokens` take at the epoch's mean so far (rows * length over the
    // documents started: from the state alone, so a resumed run pulls as the first run did);
    // one while nothing is known, or for documents longer than that.
    std::uint64_t want = 1;
    if (state_.rows > 0 && state_.documents > 0) {
      const auto mean = std::max<std::uint64_t>(
          1, static_cast<std::uint64_t>(static_cast<double>(state_.rows) *
                                        static_cast<double>(options_.length) /
                                        static_cast<double>(state_.documents)));
      want = std::clamp<std::uint64_t>((tokens + mean - 1) / mean, 1, kPackPull);
    }
    state_.pending.resize(want);
    std::size_t got = 0;
    try {
      got = upstream_->pull(state_.pending);
    } catch (...) {
      state_.pending.clear();  // the run fails; the state never holds Refs not pulled
      throw;
    }
    state_.pending.resize(got);
    if (got < want) upstream_done_ = true;  // fewer than asked: the epoch's end
    if (got == 0) return false;
    if (direct_) {
      // The chunk's views at once: their index lookups (a cache miss or two each, on a
      // shuffled order) are independent here and overlap, where one per document between
      // the planning of rows would wait for each in turn.
      pending_views_.resize(got);
      upstream_store_->views(state_.pending, field_, pending_views_);
    }
  }
  next_view_ =
      pending_views_.size() == state_.pending.size() ? &pending_views_[state_.pending_at] : nullptr;
  next = state_.pending[state_.pending_at++];
  return true;
}

bool PackNode::read_ahead(std::uint64_t at, const Ref& current) {
  // Small at first (a first batch after a start or a restore waits for little), then doubling.
  ahead_size_ = std::min(std::max<std::uint64_t>(ahead_size_ * 2, 16), options_.read_ahead);
  ahead_.clear();
  ahead_next_ = 0;
  ahead_at_ = at;
  std::size_t n = 0;
  if (upstream_->indexed()) {
    n = std::min(ahead_size_, upstream_->size(state_.epoch) - at);
    ahead_.resize(n);
    for (std::size_t i = 0; i < n; ++i) ahead_[i].ref = upstream_->at(state_.epoch, at + i);
  } else {
    // `current` (pulled already), the documents pulled with it, then what a node that decides
    // ahead (a filter over an indexed upstream) tells will come next.
    thread_local std::vector<Ref> refs;
    refs.resize(std::max<std::uint64_t>(ahead_size_, 1));
    refs[0] = current;
    n = 1;
    const std::size_t pending = std::min(state_.pending_left(), refs.size() - n);
    std::copy_n(state_.pending.begin() + static_cast<std::ptrdiff_t>(state_.pending_at), pending,
                refs.begin() + static_cast<std::ptrdiff_t>(n));
    n += pending;
    if (pending == state_.pending_left() && !upstream_done_ && n < refs.size())
      n += upstream_->upcoming(std::span(refs).subspan(n));
    ahead_.resize(n);
    for (std::size_t i = 0; i < n; ++i) ahead_[i].ref = refs[i];
  }
  {
    // A store that downloads ahead along a plan (a remote source read by range,
    // nodes/read_plan.h) gets the window's documents in order first: its downloaders fetch
    // them, `connections` at a time, while the workers read them. Asked per window, not per
    // document; a store of local files is never called.
    const auto* planner = dynamic_cast<const ReadPlanner*>(upstream_store_);
    if (planner != nullptr && planner->plans_reads()) {
      thread_local std::vector<Ref> planned;
      planned.clear();
      for (const Ahead& a : ahead_) planned.push_back(a.ref);
      planner->plan_reads(planned);
    }
  }
  parallel_(n, [&](std::size_t i) {
    Ahead& a = ahead_[i];
    try {
      Sample s;
      reader_->read(a.ref, state_.epoch, s);
      if (const Tensor* t = s.find(field_)) {
        a.tokens = *t;
        a.found = true;
      }
    } catch (...) {
      a.error = std::current_exception();  // thrown if and when pack reaches this document
    }
  });
  return n > 0;
}

PackNode::Document PackNode::next_document(const Ref& ref) {
  const std::uint64_t at = state_.documents;  // `ref`'s position in the upstream's epoch
  if (direct_) {
    if (next_view_ != nullptr) {
      if (*next_view_) return from_view(ref, **next_view_);
    } else if (auto view = upstream_store_->view(ref, field_)) {
      return from_view(ref, *view);
    }
  }
  const bool windowed = !ahead_off_ && options_.read_ahead > 1 && parallel_;
  if (!windowed) return load_document(ref);
  if (ahead_next_ == ahead_.size() || ahead_at_ + ahead_next_ != at) {
    if (!read_ahead(at, ref)) {
      // Nothing known ahead (an indexed upstream at its end): one by one for the rest of the
      // epoch.
      ahead_off_ = true;
      return load_document(ref);
    }
  }
  if (ahead_next_ == ahead_.size() || !(ahead_[ahead_next_].ref == ref)) {
    // The upstream's at() (or upcoming()) and pull() disagree: one by one from here on.
    ahead_off_ = true;
    clear_ahead();
    return load_document(ref);
  }
  Ahead& a = ahead_[ahead_next_++];
  if (a.error) {
    std::exception_ptr e = std::move(a.error);
    clear_ahead();
    std::rethrow_exception(e);
  }
  Tensor tokens = std::move(a.tokens);
  return from_read(ref, a.found ? &tokens : nullptr);
}

void PackNode::publish(std::span<const Ref> refs) {
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < planned_.size(); ++i) {
    // Rows are planned in (epoch, row) order by this node alone, so the deque stays sorted.
    const RowKey key{refs[i].shard, refs[i].index};
    if (!in_flight_.empty() && !(in_flight_.back().key < key))
      throw Error("pack '" + name() + "': row " + std::to_string(key.second) + " of epoch " +
                  std::to_string(key.first) + " planned out of order");
    in_flight_.push_back({key, std::move(planned_[i])});
  }
  planned_.clear();
  // Released rows come back to the spine with their pieces' capacity.
  for (auto& row : free_rows_) spare_.push_back(std::move(row));
  free_rows_.clear();
}

std::size_t PackNode::pull(std::span<Ref> out) {
  // The call's rows go in flight together at its end: one lock for them all (the workers
  // take it too). Rows of a call that throws were never handed out: the next call drops them.
  planned_.clear();
  std::size_t n = 0;
  while (n < out.size()) {
    std::unique_ptr<Row> made;
    if (spare_.empty()) {
      made = std::make_unique<Row>();
    } else {
      made = std::move(spare_.back());
      spare_.pop_back();
      // A released row was last touched by a worker (on another core): ask for the next one
      // now, while this one is planned, instead of waiting for its line when it is taken.
      if (!spare_.empty()) __builtin_prefetch(spare_.back().get(), 1);
      made->segments.clear();  // a row given back unplanned (or released unowned) holds pieces
      made->owners.clear();
    }
    Row& row = *made;
    struct Spare {  // a row not planned (the epoch ended) goes back
      PackNode* pack;
      std::unique_ptr<Row>& row;
      ~Spare() {
        if (row) pack->spare_.push_back(std::move(row));
      }
    } spare{this, made};
    std::uint64_t need = options_.length;
    while (need > 0) {
      if (!state_.has_carry) {
        Ref next;
        if (!next_ref(next, need + (out.size() - n - 1) * options_.length)) break;
        carry_doc_ = next_document(next);
        ++state_.documents;
        state_.carry = next;
        state_.carry_at = 0;
        state_.has_carry = extent(carry_doc_) > 0;
        continue;
      }
      const std::uint64_t take = std::min(need, extent(carry_doc_) - state_.carry_at);
      // carry_at <= numel: index numel is the separator, taken last.
      row.segments.push_back({.data = carry_doc_.data + (state_.carry_at << dtype_shift_),
                              .count = std::min(take, carry_doc_.numel - state_.carry_at),
                              .separator = state_.carry_at + take > carry_doc_.numel});
      if (carry_doc_.owner && (row.owners.empty() || row.owners.back() != carry_doc_.owner))
        row.owners.push_back(carry_doc_.owner);
      state_.carry_at += take;
      need -= take;
      if (state_.carry_at == extent(carry_doc_)) {
        state_.has_carry = false;
        state_.carry_at = 0;
        state_.carry = Ref{};
        carry_doc_ = Document();
      }
    }
    if (need == options_.length) break;  // nothing left in this epoch
    if (need > 0) {
      if (options_.drop_remainder) break;
      row.segments.push_back({.count = need, .pad = true});
    }
    row.dtype = *dtype_;  // a row starts with tokens, so a document was seen
    const Ref ref{source_id_, static_cast<std::uint32_t>(state_.epoch), state_.rows++};
    planned_.push_back(std::move(made));
    out[n++] = ref;
  }
  if (!planned_.empty()) publish(out);
  return n;
}

// The shared members' own cache lines (pack.h) rely on this.
static_assert(alignof(PackNode) == 64 && sizeof(PackNode) % 64 == 0);

std::span<const std::byte> PackNode::record(const Ref&) const {
  throw Error("pack '" + name() + "' rows have no stored bytes; read them");
}

std::deque<PackNode::InFlight>::iterator PackNode::find_slot(const Ref& ref) const {
  const RowKey key{ref.shard, ref.index};
  // Rows of an epoch are numbered one after another and leave from the front: a row of the
  // front's epoch lies at its distance from the front (checked; else, across an epoch's end,
  // by bisection).
  if (!in_flight_.empty() && in_flight_.front().key.first == key.first &&
      key.second >= in_flight_.front().key.second) {
    const std::uint64_t i = key.second - in_flight_.front().key.second;
    if (i < in_flight_.size()) {
      auto at = in_flight_.begin() + static_cast<std::ptrdiff_t>(i);
      if (at->key == key) return at->row ? at : in_flight_.end();
    }
  }
  auto at = std::lower_bound(in_flight_.begin(), in_flight_.end(), key,
                             [](const InFlight& f, const RowKey& k) { return f.key < k; });
  return at != in_flight_.end() && at->key == key && at->row ? at : in_flight_.end();
}

const PackNode::Row* PackNode::find_row_locked(const Ref& ref) const {
  auto it = find_slot(ref);
  if (it == in_flight_.end())
    throw Error("pack '" + name() + "': row " + std::to_string(ref.index) + " of epoch " +
                std::to_string(ref.shard) + " is not in flight");
  return it->row.get();
}

void PackNode::fill(const Row& row, std::byte* dst, std::int32_t* ids) const {
  const DType d = row.dtype;
  const std::size_t es = dtype_size(d);
  auto put = [&](std::size_t at, std::uint64_t count, std::int64_t value) {
    visit_dtype(d, [&]<class T>() {
      const T v = static_cast<T>(value);
      for (std::uint64_t i = 0; i < count; ++i) std::memcpy(dst + (at + i) * es, &v, es);
    });
  };
  std::size_t at = 0;
  std::int32_t doc = 0;
  for (const Segment& seg : row.segments) {
    if (ids != nullptr)
      std::fill_n(ids + at, seg.count + (seg.separator ? 1 : 0), seg.pad ? -1 : doc++);
    if (seg.pad) {
      put(at, seg.count, options_.pad);
      at += seg.count;
      continue;
    }
    if (seg.count > 0) {
      std::memcpy(dst + at * es, seg.data, seg.count * es);
      at += seg.count;
    }
    if (seg.separator) {  // the separator closes this document
      put(at, 1, options_.separator);
      at += 1;
    }
  }
}

void PackNode::read(const Ref& ref, Sample& sample) const {
  // The row stays in flight (its pointer valid) until its batch, which this read is part
  // of, is assembled and released.
  const Row* found = nullptr;
  {
    std::lock_guard lock(mu_);
    found = find_row_locked(ref);
  }
  const Row& row = *found;
  const auto length = static_cast<std::int64_t>(options_.length);
  Tensor out(row.dtype, Shape{length});
  Tensor ids;
  if (options_.doc_ids) ids = Tensor(DType::kInt32, Shape{length});
  fill(row, static_cast<std::byte*>(out.data()),
       options_.doc_ids ? static_cast<std::int32_t*>(ids.data()) : nullptr);
  sample.ref = ref;
  sample.set(field_, std::move(out));
  if (options_.doc_ids) sample.set(ids_field_, std::move(ids));
}

bool PackNode::gather(std::span<const Ref> refs, BufferPool& pool, Fields& fields) const {
  if (refs.empty()) return false;
  thread_local std::vector<const Row*> rows;  // valid until release(), after this batch
  rows.clear();
  {
    std::lock_guard lock(mu_);
    for (const Ref& r : refs) rows.push_back(find_row_locked(r.record()));
  }
  const DType d = rows.front()->dtype;
  const std::size_t row_bytes = options_.length * dtype_size(d);
  auto buffer = pool.acquire(row_bytes * rows.size());
  auto* dst = static_cast<std::byte*>(buffer->data());
  std::shared_ptr<Buffer> id_buffer;
  std::int32_t* ids = nullptr;
  if (options_.doc_ids) {
    id_buffer = pool.acquire(options_.length * sizeof(std::int32_t) * rows.size());
    ids = static_cast<std::int32_t*>(id_buffer->data());
  }
  // The pieces lie at random places of the mapped file: asking for the heads of the next
  // row's pieces while this one is copied starts their misses and page walks early; the
  // hardware prefetcher follows within a piece once the copy streams it. Asking for every
  // line of the next row (64 prefetches a row) did no better and cost more instructions
  // (bench/RESULTS.md, issue 26).
  auto prefetch = [&](const Row& row) {
    const std::size_t es = dtype_size(row.dtype);
    for (const Segment& seg : row.segments) {
      if (seg.pad || seg.count == 0) continue;
      __builtin_prefetch(seg.data);
      if (seg.count * es > 64) __builtin_prefetch(seg.data + 64);
    }
  };
  prefetch(*rows.front());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i + 1 < rows.size()) prefetch(*rows[i + 1]);
    fill(*rows[i], dst + i * row_bytes, ids != nullptr ? ids + i * options_.length : nullptr);
  }
  const Shape shape{static_cast<std::int64_t>(rows.size()),
                    static_cast<std::int64_t>(options_.length)};
  fields.set(field_, Tensor(std::move(buffer), 0, d, shape));
  if (ids != nullptr) fields.set(ids_field_, Tensor(std::move(id_buffer), 0, DType::kInt32, shape));
  return true;
}

void PackNode::release(std::span<const Ref> refs) const {
  thread_local std::vector<std::unique_ptr<Row>> done;
  done.clear();
  {
    std::lock_guard lock(mu_);
    for (const Ref& r : refs) {
      auto it = find_slot(r);
      if (it == in_flight_.end()) continue;
      // Rows of views hold no memory: they go back at once, their pieces cleared when reused.
      if (!it->row->owners.empty())
        done.push_back(std::move(it->row));
      else
        free_rows_.push_back(std::move(it->row));
    }
    while (!in_flight_.empty() && !in_flight_.front().row) in_flight_.pop_front();
  }
  if (done.empty()) return;
  // Outside the lock: dropping the pieces may free documents read in the spine.
  for (auto& row : done) row->owners.clear();
  std::lock_guard lock(mu_);
  for (auto& row : done) free_rows_.push_back(std::move(row));
}

}  // namespace flowstate
