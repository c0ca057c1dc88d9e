// `pack`: concatenates token sequences — each followed by a separator token when one is set —
// and cuts the stream into rows of exactly `length` tokens, the layout of LLM pre-training.
// A document longer than a row spans several rows; a row usually holds the tail of one
// document and the heads of the next. Rows keep the documents' dtype (any integer type).
//
// The spine only plans rows: each row is a list of pieces (document, begin, end). Planning
// needs a document's length only; where the upstream store can show a document where it lies
// in memory (RecordStore::view: the `indexed` source, from its index, O(1)) and no map comes
// between it and pack, the spine reads no token at all, and the parallel workers copy each
// piece once, straight from the mapped file into the batch buffer (RecordStore::gather).
// Otherwise each document is read once (through the maps before pack — a tokenizer) and the
// rows hold shared views of those tokens until the batch that contains them is assembled.
// Those reads run ahead of the spine's position and in parallel: a window of the next
// `read_ahead` documents is read at once on the pipeline's workers — where pack's upstream
// gives random access (a source, shard, global shuffle) `upstream->at(epoch, documents + k)`,
// else the documents pack has pulled and not started, then what the upstream tells it will
// pass on (a filter over an indexed upstream: SpineNode::upcoming) — and each document pack
// starts is checked against the window's front. The window is never part of the state (a
// restore or a new epoch drops it), and a read that failed throws when pack reaches that
// document, as it would have without the window.
//
// Pack pulls the documents the rows it is asked for likely take at once, up to kPackPull
// (a text pipeline's spine pays a virtual call and a timer per node per pull). Its state is
// stamped by reference: the epoch, the rows emitted, the carry-over (the Ref of the document
// the next row starts in and how far into it) and the Refs pulled and not started yet; never
// tokens. A restore looks at the carry document again. So the upstream's store must be able
// to read a Ref again (file sources, indexed ranges and mix of them can; a generator cannot:
// that is a ConfigError when the pipeline starts).
//
// At the end of an epoch the tokens left over (less than a row) are dropped, or padded to a
// full row with `pad` when `drop_remainder` is false. With `doc_ids`, every row also gets
// `<field>_doc_ids`: int32 [length], the index of the document each token belongs to within
// the row (0 for the piece the row starts with, +1 at every document start; a separator
// belongs to the document it closes; padding is -1) — what an attention mask that does not
// cross documents, position ids or flash-attention's cu_seqlens are derived from.
//
//   builder.pack({.length = 2048, .field = "tokens", .separator = 0, .doc_ids = true});
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

/// Options of the `pack` node.
struct PackOptions {
  std::uint64_t length = 0;      ///< tokens per row; required, > 0
  std::string field = "tokens";  ///< the 1-D integer token field read and written
  std::int64_t separator = -1;   ///< appended after every document; < 0: none
  bool drop_remainder = true;    ///< drop the epoch's last partial row (else pad it)
  std::int64_t pad = 0;          ///< the token padding a partial last row
  bool doc_ids = false;          ///< add `<field>_doc_ids`: each token's document in its row
  /// Documents read ahead of the spine, in parallel, where they must be read (a map before
  /// pack, JSON Lines): from an indexed upstream, or those pack pulled and a filter's
  /// upcoming ones; 0 reads them one by one. Never changes a row.
  std::uint64_t read_ahead = 256;

  static constexpr auto table() {
    using O = PackOptions;
    return std::tuple{
        param("length", &O::length, {.min = 1, .required = true, .doc = "tokens per row"}),
        param("field", &O::field, {.doc = "the 1-D integer token field"}),
        param("separator", &O::separator, {.doc = "token appended after every sequence; -1: none"}),
        param("drop_remainder", &O::drop_remainder,
              {.doc = "drop the epoch's last partial row (false: pad it)"}),
        param("pad", &O::pad, {.doc = "the token that pads a partial last row"}),
        param("doc_ids", &O::doc_ids,
              {.doc = "add '<field>_doc_ids', int32 per token: the index of its document in "
                      "the row (padding: -1), for attention that does not cross documents",
               .describe_if = [](const O& o) { return o.doc_ids; }}),
        param("read_ahead", &O::read_ahead,
              {.max = 1 << 20,
               .free = true,
               .doc = "documents read ahead in parallel when they must be read (a map before "
                      "pack, JSON Lines); 0: one by one"}),
    };
  }
  /// pack needs a token field.
  void validate() const;
};

/// The `pack` node's definition.
const NodeDef& pack_node();

/// The most documents pack pulls from its upstream at once (as many as the rows it is asked
/// for likely take): the spine's per-pull cost (a virtual call and a timer per node on the
/// way) is paid once per chunk, not per document.
inline constexpr std::size_t kPackPull = 64;

/// State of `pack`: positions only (Refs, never tokens).
struct PackState {
  std::uint64_t epoch = 0;
  std::uint64_t rows = 0;       ///< rows emitted in this epoch
  bool has_carry = false;       ///< the next row starts inside `carry`
  Ref carry;                    ///< the document the next row starts in
  std::uint64_t carry_at = 0;   ///< tokens of `carry` (separator included) already used
  std::uint64_t documents = 0;  ///< documents started in this epoch (the carry's included)
  /// Documents pulled from the upstream and not started yet, in order: `pending[pending_at..]`
  /// (at most kPackPull). The upstream's position is documents + those. Version 2; a version-1
  /// state has none.
  std::vector<Ref> pending;
  std::size_t pending_at = 0;  ///< not stored: a loaded state starts at 0
  std::size_t pending_left() const { return pending.size() - pending_at; }

  template <class Archive>
  void save(Archive& ar, std::uint32_t) const {
    ar(epoch, rows, has_carry, carry, carry_at, documents);
    ar(static_cast<std::uint64_t>(pending_left()));
    for (std::size_t i = pending_at; i < pending.size(); ++i) ar(pending[i]);
  }
  template <class Archive>
  void load(Archive& ar, std::uint32_t version) {
    require_state_version("PackState", version, 2);
    ar(epoch, rows, has_carry, carry, carry_at, documents);
    pending.clear();
    pending_at = 0;
    if (version < 2) return;
    std::uint64_t n = 0;
    ar(n);
    if (n > kPackPull)
      throw CheckpointError("state", "pack state holds " + std::to_string(n) +
                                         " pending documents; at most " +
                                         std::to_string(kPackPull) + " are possible");
    pending.resize(n);
    for (Ref& r : pending) ar(r);
  }
};

/// The `pack` spine node; also the RecordStore of the rows it plans.
class PackNode final : public StatefulSpineNode<PackState>, public RecordStore {
 public:
  /// `reader` reads an upstream Ref as pack sees it (maps before pack applied); `upstream_store`
  /// gets each document's Ref back once its tokens are held. `source_id` goes into the rows'
  /// Refs. With `direct` (no map between the store and pack), documents the store can view()
  /// are planned from their length and never read in the spine. `parallel` reads documents
  /// ahead of the spine (none: one by one). `options` passed their table's checks (length >= 1).
  PackNode(std::string name, PackOptions options, const SampleReader* reader,
           const RecordStore* upstream_store, std::uint32_t source_id, bool direct = false,
           ParallelFor parallel = {});

  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

  std::size_t record_bytes() const override { return 0; }
  std::span<const std::byte> record(const Ref& ref) const override;
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }
  void release(std::span<const Ref> refs) const override;
  bool rereadable() const override { return false; }  ///< a row lives until released
  /// Copies every piece of the rows once, from where it lies, into [n, length] buffers.
  bool gather(std::span<const Ref> refs, BufferPool& pool, Fields& fields) const override;

 protected:
  void on_restored() override;

 private:
  /// A document's tokens: `numel` elements at `data`, which lie in the upstream store's memory
  /// (a view) or in `owner`, the buffer of the tensor read in the spine (a pointer, not a
  /// Tensor: pieces are copied per row, and a Tensor is ~100 bytes).
  struct Document {
    std::shared_ptr<const Buffer> owner;
    const std::byte* data = nullptr;
    std::uint64_t numel = 0;
  };
  /// A piece of a row, as the worker that fills the row needs it: `count` tokens at `data`,
  /// then the separator when the piece closes its document (`separator`); with `pad`, `count`
  /// padding tokens. 24 bytes, where a Document and the piece's bounds made 56: a row is
  /// planned on the spine's core and read on a worker's, and its pieces cross between the
  /// two cores' caches twice (read there, written here again when the row is reused), so
  /// their lines are a cost per row (bench/RESULTS.md, issue 26).
  struct Segment {
    const std::byte* data = nullptr;
    std::uint64_t count = 0;
    bool separator = false;
    bool pad = false;
  };
  static_assert(sizeof(Segment) == 24);
  struct Row {
    DType dtype = DType::kInt32;  ///< of its documents
    std::vector<Segment> segments;
    /// The buffers of documents read in the spine that its pieces lie in (none for views,
    /// whose memory is the store's): held until the row is released.
    std::vector<std::shared_ptr<const Buffer>> owners;
  };
  /// Looks at (view) or reads a document's tokens, checking they are 1-D integers of the
  /// pack's dtype, and hands the Ref back to the upstream store.
  Document load_document(const Ref& ref);
  /// The document `ref` that the spine pulled as the epoch's `state_.documents`-th: from the
  /// read-ahead window where it can be, else load_document.
  Document next_document(const Ref& ref);
  /// A document planned from the store's view of it (no read).
  Document from_view(const Ref& ref, const RecordView& view);
  /// A document read through the maps: `tokens` is its field (null when it has none).
  Document from_read(const Ref& ref, const Tensor* tokens);
  /// The next document to start: from state_.pending, refilled by one pull from the upstream
  /// of the documents `tokens` more tokens likely take (at most kPackPull); false at the end
  /// of the upstream's epoch.
  bool next_ref(Ref& next, std::uint64_t tokens);
  /// Reads the upstream's next documents (from position `at` of the epoch, `current` being the
  /// one there: at() where the upstream is indexed, else `current`, the pending ones and what
  /// upcoming() tells) into the window, in parallel; false when none.
  bool read_ahead(std::uint64_t at, const Ref& current);
  /// Drops the window (a new epoch, a restore).
  void clear_ahead();
  /// Carries the restored state's Refs over to a source whose files changed (DataChange::
  /// renumber): the carry and the pending documents renumbered; pending documents of a removed
  /// file skipped, and the rest of a carry document of a removed file skipped (the next row
  /// starts with the next document). Notes what it skipped.
  void renumber(const DataChange& change);
  /// Throws DataError unless `d` is an integer dtype equal to the earlier documents'.
  void check_dtype(const Ref& ref, DType d, const Shape& shape);
  std::uint64_t extent(const Document& doc) const {
    return doc.numel + (options_.separator >= 0 ? 1 : 0);
  }
  /// (epoch, row index): a row's place in planning order.
  using RowKey = std::pair<std::uint32_t, std::uint64_t>;
  /// A row in flight; `row` is null once released (the slot leaves from the front).
  struct InFlight {
    RowKey key;
    std::unique_ptr<Row> row;
  };
  /// The planned row `ref`, holding mu_; throws when unknown. The pointer stays valid until
  /// the row is released (after the batch that holds it is assembled).
  const Row* find_row_locked(const Ref& ref) const;
  /// The slot of an unreleased row, or in_flight_.end(); holding mu_.
  std::deque<InFlight>::iterator find_slot(const Ref& ref) const;
  /// Puts planned_ in flight as `refs` (one lock for a pull's rows) and takes the released
  /// rows back for reuse.
  void publish(std::span<const Ref> refs);
  /// Writes `row`'s tokens to `dst` (length elements) and, when set, its document ids.
  void fill(const Row& row, std::byte* dst, std::int32_t* ids) const;

  PackOptions options_;
  const SampleReader* reader_;
  const RecordStore* upstream_store_;
  std::uint32_t source_id_;
  bool direct_;
  FieldId field_;
  FieldId ids_field_;
  ParallelFor parallel_;
  /// A document read ahead: its field, or the error its read threw (thrown when pack gets there).
  struct Ahead {
    Ref ref;
    Tensor tokens;
    bool found = false;
    std::exception_ptr error;
  };
  std::vector<Ahead> ahead_;      ///< documents [ahead_at_, ahead_at_ + size) of the epoch
  std::size_t ahead_next_ = 0;    ///< the next one the spine takes
  std::uint64_t ahead_at_ = 0;    ///< the upstream position of ahead_[0]
  std::uint64_t ahead_size_ = 0;  ///< the next window's size: grows to read_ahead from 16
  /// No window for the rest of the epoch: nothing known ahead (an upstream neither indexed nor
  /// deciding ahead), or at()/upcoming() disagreed with pull().
  bool ahead_off_ = false;
  std::optional<DType> dtype_;    ///< of the first document read; every one must match
  std::uint8_t dtype_shift_ = 0;  ///< log2 of dtype_'s size
  Document carry_doc_;            ///< the tokens of state_.carry while has_carry
  bool upstream_done_ = false;    ///< the upstream's epoch has ended (pending may remain)
  /// With `direct`: the store's views of state_.pending, taken when they were pulled (empty
  /// after a restore: those are viewed one by one), and the view of the Ref next_ref gave
  /// last (null: none taken).
  std::vector<std::optional<RecordView>> pending_views_;
  const std::optional<RecordView>* next_view_ = nullptr;
  // The spine's: a pull's rows until they go in flight, and released rows to plan into (a
  // row's pieces keep their capacity: no allocation per row once running).
  std::vector<std::unique_ptr<Row>> planned_, spare_;
  // Rows planned and not yet released, in planning order (read by the parallel workers), and
  // released rows on their way back to the spine. On cache lines of their own: the workers
  // take mu_ for every batch, and the spine's members above must not move between cores with
  // it (bench/RESULTS.md, issue 26: 3% of a 2-worker W2 run).
  // (alignas makes the class 64-aligned and its size a multiple of 64: nothing after a
  // PackNode shares these lines either.)
  alignas(64) mutable std::mutex mu_;
  mutable std::deque<InFlight> in_flight_;
  mutable std::vector<std::unique_ptr<Row>> free_rows_;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::PackState, 2);
