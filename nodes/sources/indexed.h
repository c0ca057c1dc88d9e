// `indexed` source: Megatron-LM's indexed data set (the MMapIndexedDataset layout that
// Megatron-LM, NeMo and GPT-NeoX write): PREFIX.idx beside PREFIX.bin. `paths` match the .idx
// files; several prefixes concatenate in order, like the other sources' files.
//
// PREFIX.idx, little-endian:
//   "MMIDIDX\0\0"  u64 version (1)  u8 dtype code  u64 S (sequences)  u64 D (entries of the
//   document index, i.e. documents + 1)  i32 lengths[S] (items)  i64 pointers[S] (byte offsets
//   into .bin)  i64 document_index[D] (document d is sequences [doc[d], doc[d+1]))
//   and, in multimodal sets, i8 modes[S] (ignored).
// dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
//
// A record is a sequence (`unit: sequence`) or a document (`unit: document`, the default: its
// sequences are contiguous in .bin), read as a 1-D tensor of the file's dtype in `field`,
// copied from the memory-mapped .bin; view() shows it where it lies without a copy (what pack
// plans rows from). O(1) random access: global and buffer shuffle, shard and
// exact resume work as for `records`. Opening checks the whole index against the .bin (O(S)
// reads of the mapped index, no .bin bytes): an error names the file and the entry.
//
//   IndexedOptions o{.paths = {"data/*.idx"}, .field = "tokens"};
//
// Writing: PREFIX.bin is the sequences' items end to end, little-endian; megatron_index makes
// the PREFIX.idx that describes them (`flowstate gen indexed` and the tests write through it):
//
//   write(prefix + ".idx", megatron_index(DType::kUInt16, lengths));  // a document a sequence
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/dtype.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/read_plan.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_blocks.h"
#include "flowstate/nodes/sources/remote_options.h"
#include "flowstate/nodes/sources/remote_window.h"

namespace flowstate {

/// What one record of an `indexed` source is.
enum class IndexedUnit : std::uint8_t {
  kDocument,  ///< a document: its sequences, contiguous
  kSequence,  ///< one sequence (a sentence, in data sets split that way)
};
template <>
struct EnumNames<IndexedUnit> {
  static constexpr std::array<std::pair<IndexedUnit, const char*>, 2> values{
      {{IndexedUnit::kDocument, "document"}, {IndexedUnit::kSequence, "sequence"}}};
};

/// Options of the `indexed` source.
struct IndexedOptions {
  std::vector<std::string> paths;  ///< the .idx files or globs; each glob's matches sorted
  std::string field = "tokens";    ///< the 1-D field of each sample
  IndexedUnit unit = IndexedUnit::kDocument;
  /// Relative paths resolve against it (a YAML file's directory); not described.
  std::filesystem::path base_dir;
  FileVerify verify = FileVerify::kSampled;  ///< how a resume checks the files (free)
  /// Blocks of a remote .bin held ahead of the reads (see RemoteBlocks; free).
  std::size_t lookahead = kDefaultLookahead;
  CacheOptions cache;    ///< the local cache of remote files (free)
  RemoteOptions remote;  ///< how remote files are reached (free)

  static constexpr auto table() {
    using O = IndexedOptions;
    return std::tuple{
        param("paths", &O::paths,
              {.required = true,
               .doc = "the .idx files (each beside its .bin) or globs, each glob's matches in "
                      "sorted order; relative to the YAML file; or s3://, http(s):// URLs of "
                      "PREFIX or PREFIX.idx (the .idx fetched whole, the .bin read by range)",
               .check = check_paths}),
        param("field", &O::field, {.doc = "name of the 1-D field (the file's dtype)"}),
        param("unit", &O::unit, {.doc = "a record is a document or a sequence"}),
        verify_param<O>(),
        lookahead_param<O>(
            "blocks of a remote PREFIX.bin (s3://, http(s)://) held ahead of the reads, "
            "downloading in the background; the cache limit must hold the .idx files and this "
            "many blocks and one more"),
        cache_param<O>(),
        remote_param<O>(),
    };
  }
};

/// The `indexed` source's definition.
const NodeDef& indexed_node();

/// The dtype of Megatron's dtype code; nullopt for an unknown code.
std::optional<DType> megatron_dtype(std::uint8_t code);
/// Megatron's code of `dtype`; nullopt for one it cannot hold (uint32, uint64, bool).
std::optional<std::uint8_t> megatron_dtype_code(DType dtype);

/// The bytes of a PREFIX.idx (version 1) for sequences of `lengths` items of `dtype` lying end
/// to end in PREFIX.bin: pointers[s] is the sum of the lengths before s times the item size.
/// `documents` is the document index (document d is sequences [documents[d],
/// documents[d + 1])): it starts at 0, never decreases and ends at the number of sequences;
/// empty, each sequence is a document. Throws std::invalid_argument for a dtype Megatron has
/// no code for, a negative length or a document index other than that.
std::string megatron_index(DType dtype, std::span<const std::int32_t> lengths,
                           std::span<const std::uint64_t> documents = {});

/// One opened PREFIX.idx / PREFIX.bin pair, checked.
class IndexedFile {
 public:
  /// Maps and checks `idx_path` and the .bin beside it; DataError naming the file and entry.
  explicit IndexedFile(const std::string& idx_path);
  /// A remote pair: the .idx's cached copy `idx` (named `idx_url` in messages), and the .bin,
  /// object `bin_object` of `blocks`, read by range. Checks as the local one does.
  IndexedFile(std::shared_ptr<const CachePin> idx, const std::string& idx_url,
              const RemoteBlocks& blocks, std::size_t bin_object);

  DType dtype() const { return dtype_; }
  std::uint64_t sequences() const { return sequences_; }
  std::uint64_t documents() const { return documents_; }
  /// The mapped .bin of a local pair; null for a remote one.
  const MappedFile* mapped_bin() const { return bin_.get(); }
  /// The .bin's path, or its URL.
  const std::string& bin_name() const { return bin_name_; }
  std::uint64_t bin_size() const { return bin_size_; }
  /// The bytes of sequence `i` / document `d` (of a remote .bin: valid on the calling thread
  /// until its next read; see RemoteBlocks::read).
  std::span<const std::byte> sequence(std::uint64_t i) const;
  std::span<const std::byte> document(std::uint64_t d) const;
  /// Asks for the index entries sequence `i` / document `d` will read (no wait: a prefetch).
  void prefetch_sequence(std::uint64_t i) const;
  void prefetch_document(std::uint64_t d) const;
  /// Whether the .bin is remote (read by blocks).
  bool remote() const { return blocks_ != nullptr; }
  /// Of a remote .bin: the read of document `i` (`document`) or sequence `i` as a range of its
  /// object in the RemoteBlocks (what RemoteBlocks::plan takes).
  PlannedRead planned_read(std::uint64_t i, bool document) const;
  /// Of a remote .bin whose reader holds every block: document `i` (`document`) or sequence
  /// `i`, valid as long as the reader lives (RemoteBlocks::view).
  std::span<const std::byte> stable(std::uint64_t i, bool document) const;

 private:
  /// Reads the header of the .idx (named `idx` in messages) and checks its layout.
  void check_index(const std::string& idx);
  /// Checks the sequences and documents against the .bin's size.
  void check_entries(const std::string& idx);
  /// Bytes [begin, end) of document `d` / sequence `i` in the .bin.
  std::pair<std::uint64_t, std::uint64_t> document_range(std::uint64_t d) const;
  /// Bytes [begin, end) of the .bin.
  std::span<const std::byte> bin_bytes(std::uint64_t begin, std::uint64_t end) const {
    if (blocks_ != nullptr) [[unlikely]]
      return blocks_->read(bin_object_, begin, static_cast<std::size_t>(end - begin));
    return {bin_data_ + begin, static_cast<std::size_t>(end - begin)};
  }
  std::int32_t length(std::uint64_t i) const;
  std::int64_t pointer(std::uint64_t i) const;
  std::int64_t doc(std::uint64_t d) const;
  /// Points idx_data_ at a copy of the .idx in huge pages (an index of 2 MiB up to 1/16 of the
  /// memory, read with pread), else at the mapping. Checking the index at open reads every entry
  /// and a shuffled epoch reads them in a random order: mapped in 4 KiB pages, each page's first
  /// touch faults (~1000 for 200 000 documents), and each lookup risks a TLB miss.
  void copy_index_into_huge_pages();

  std::shared_ptr<const MappedFile> idx_, bin_;  ///< bin_: null for a remote .bin
  std::shared_ptr<const CachePin> idx_pin_;      ///< a remote .idx's cached copy, pinned
  const std::byte* bin_data_ = nullptr;          ///< the mapped .bin (local)
  const RemoteBlocks* blocks_ = nullptr;         ///< the remote .bin's reader, or null
  std::size_t bin_object_ = 0;                   ///< the .bin among blocks_'s objects
  std::string bin_name_;
  std::uint64_t bin_size_ = 0;
  std::shared_ptr<std::byte> idx_copy_;  ///< the .idx's bytes in huge pages, or null
  const std::byte* idx_data_ = nullptr;  ///< the .idx's bytes: idx_copy_ or the mapping
  DType dtype_ = DType::kUInt8;
  std::size_t item_ = 1;
  std::uint64_t sequences_ = 0;
  std::uint64_t documents_ = 0;
  /// The document index is 0, 1, ..., S (each sequence a document, as Megatron's and
  /// `flowstate gen`'s pre-training sets are): document d is sequence d, found without reading
  /// the document index (one cache miss per document of a shuffled order, not two).
  bool one_sequence_per_document_ = false;
  std::size_t lengths_at_ = 0, pointers_at_ = 0, docs_at_ = 0;  ///< byte offsets in .idx
};

/// The `indexed` source.
///
/// Mapped .bin files — together at most a quarter of the machine's memory — have their pages
/// mapped in on a thread of the source's own from the open on (madvise MADV_POPULATE_READ,
/// 8 MiB at a time, file after file): an epoch reads every document, and the first touch of
/// each page would otherwise fault on the workers that copy the documents, a few pages at a
/// time in a random order, where the kernel maps a whole run of pages in one call. A file not
/// in the page cache yet is read into it on the way. The destructor stops the thread at the
/// next 8 MiB (a forked child's copy of the source does not wait: the thread is the parent's).
/// Nothing a run delivers depends on it.
class IndexedSource final : public FileSource, public ReadPlanner {
 public:
  IndexedSource(std::string name, IndexedOptions options, std::uint32_t source_id = 0);
  ~IndexedSource() override;

  std::size_t record_bytes() const override { return 0; }
  std::span<const std::byte> record(const Ref& ref) const override;
  /// False while remote files are read by blocks that the cache does not hold all of.
  bool stable_records() const override { return !blocks_ || blocks_->holds_all(); }
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }
  /// The tokens of `ref` in the mapped .bin, found from the index alone (O(1), no .bin read).
  std::optional<RecordView> view(const Ref& ref, FieldId field) const override;
  /// The views of a chunk: every index entry they need is prefetched first, then read.
  void views(std::span<const Ref> refs, FieldId field,
             std::span<std::optional<RecordView>> out) const override;
  /// True when a .bin is remote and its RemoteBlocks plans (RemoteBlocks::plans).
  bool plans_reads() const override { return blocks_ && blocks_->plans(); }
  /// The remote documents (or sequences) among `refs`, as byte ranges, to RemoteBlocks::plan.
  void plan_reads(std::span<const Ref> refs) const override;

 protected:
  void epoch_started(std::uint64_t epoch) override;

 private:
  /// Starts populate_ over the mapped .bin files (see the class comment).
  void start_populating();
  /// Opens the pairs `paths` name when any is a URL (a local one as before), in order.
  void open_with_remote();

  IndexedOptions options_;
  FieldId field_;
  /// Reads the remote .bin files by range; null when every file is local. Declared before
  /// files_data_, which point into it: destroyed after them.
  std::unique_ptr<RemoteBlocks> blocks_;
  std::vector<std::unique_ptr<IndexedFile>> files_data_;
  /// Maps the .bin files' pages in; joined by the destructor in the process that started it (a
  /// forked child's copy of the source leaves it: the thread stayed in the parent).
  std::unique_ptr<std::thread> populate_;
  pid_t populate_pid_ = 0;  ///< the process populate_ runs in
  std::atomic<bool> stop_populating_{false};
};

}  // namespace flowstate
