// `pack`: concatenates token sequences — each followed by a separator token when one is set —
// and cuts the stream into rows of exactly `length` tokens, the layout of LLM pre-training.
// A document longer than a row spans several rows; a row usually holds the tail of one
// document and the heads of the next.
//
// The node reads each upstream sample once, in the spine, to learn its tokens; the rows it
// plans hold shared views of those tokens until the batch that contains them is assembled.
// Its state is stamped by reference: the epoch, the rows emitted, and the carry-over — the
// Ref of the document the next row starts in and how far into it — never tokens. A restore
// re-reads that one document. So the upstream's store must be able to read a Ref again (file
// sources, indexed ranges and mix of them can; a generator cannot: that is a ConfigError
// when the pipeline starts).
//
// At the end of an epoch the tokens left over (less than a row) are dropped, or padded to a
// full row with `pad` when `drop_remainder` is false.
//
//   builder.pack({.length = 2048, .field = "tokens", .separator = 0});
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

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

  static constexpr auto table() {
    using O = PackOptions;
    return std::tuple{
        param("length", &O::length, {.min = 1, .required = true, .doc = "tokens per row"}),
        param("field", &O::field, {.doc = "the 1-D integer token field"}),
        param("separator", &O::separator, {.doc = "token appended after every sequence; -1: none"}),
        param("drop_remainder", &O::drop_remainder,
              {.doc = "drop the epoch's last partial row (false: pad it)"}),
        param("pad", &O::pad, {.doc = "the token that pads a partial last row"}),
    };
  }
  /// pack needs a token field.
  void validate() const;
};

/// The `pack` node's definition.
const NodeDef& pack_node();

/// State of `pack`: positions only.
struct PackState {
  std::uint64_t epoch = 0;
  std::uint64_t rows = 0;       ///< rows emitted in this epoch
  bool has_carry = false;       ///< the next row starts inside `carry`
  Ref carry;                    ///< the document the next row starts in
  std::uint64_t carry_at = 0;   ///< tokens of `carry` (separator included) already used
  std::uint64_t documents = 0;  ///< documents read in this epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("PackState", version, 1);
    ar(epoch, rows, has_carry, carry, carry_at, documents);
  }
};

/// The `pack` spine node; also the RecordStore of the rows it plans.
class PackNode final : public StatefulSpineNode<PackState>, public RecordStore {
 public:
  /// `reader` reads an upstream Ref as pack sees it (maps before pack applied); `upstream_store`
  /// gets each document's Ref back once its tokens are held. `source_id` goes into the rows'
  /// Refs.
  PackNode(std::string name, PackOptions options, const SampleReader* reader,
           const RecordStore* upstream_store, std::uint32_t source_id);

  std::uint64_t size(std::uint64_t epoch) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

  std::size_t record_bytes() const override { return 0; }
  std::span<const std::byte> record(const Ref& ref) const override;
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }
  void release(std::span<const Ref> refs) const override;
  bool rereadable() const override { return false; }  ///< a row lives until released

 protected:
  void on_restored() override;

 private:
  /// A piece of a row: tokens [begin, end) of a document, where index `tokens.numel()` is
  /// the separator; without `tokens`, end - begin padding tokens.
  struct Segment {
    Tensor tokens;
    std::uint64_t begin = 0, end = 0;
  };
  /// Reads a document's token tensor, checking it is 1-D and of the pack's dtype.
  Tensor read_document(const Ref& ref);
  std::uint64_t extent(const Tensor& doc) const {
    return static_cast<std::uint64_t>(doc.numel()) + (options_.separator >= 0 ? 1 : 0);
  }

  PackOptions options_;
  const SampleReader* reader_;
  const RecordStore* upstream_store_;
  std::uint32_t source_id_;
  FieldId field_;
  std::optional<DType> dtype_;  ///< of the first document read; every one must match
  Tensor carry_tokens_;         ///< the tokens of state_.carry while has_carry
  bool upstream_done_ = false;  ///< the upstream's epoch has ended
  // Rows planned and not yet released, by row index (read by parallel workers).
  mutable std::mutex mu_;
  mutable std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<Segment>> rows_;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::PackState, 1);
