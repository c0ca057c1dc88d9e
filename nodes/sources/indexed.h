// `indexed` source: Megatron-LM's indexed data set (the MMapIndexedDataset layout that
// Megatron-LM, NeMo and GPT-NeoX write): PREFIX.idx beside PREFIX.bin. `paths` match the .idx
// files; several prefixes concatenate in order, like the other sources' files.
//
// The layout, its dtype codes and the writer: megatron_index.h.
//
// A record is a sequence (`unit: sequence`) or a document (`unit: document`, the default: its
// sequences are contiguous in .bin), read as a 1-D tensor of the file's dtype in `field`,
// copied from the memory-mapped .bin; view() shows it where it lies without a copy (what pack
// plans rows from). O(1) random access: global and buffer shuffle, shard and
// exact resume work as for `records`. Opening checks the whole index against the .bin (O(S)
// reads of the mapped index, no .bin bytes): an error names the file and the entry. A source
// of more pairs than it keeps mapped (mapped_files_limit(), two files a pair) reads each .idx
// into memory and its .bin through a MappedFileSet, mapped as reads reach it.
//
//   IndexedOptions o{.paths = {"data/*.idx"}, .field = "tokens"};
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
#include "flowstate/nodes/sources/mapped_file_set.h"
#include "flowstate/nodes/sources/megatron_index.h"
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

/// Memory for the .idx files of a source with more local files than it keeps mapped (issue 23:
/// "100 000 local files work"): each index is read into it and its mapping closed. Chunks of
/// 64 MiB, one mapping each, rather than a mapping an index; an index over a quarter of that
/// gets a block of its own. Not thread-safe: the source fills it while it opens its files.
class IndexCopies {
 public:
  /// `bytes` bytes, 8-aligned, valid as long as this lives.
  std::byte* allocate(std::size_t bytes);

 private:
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::byte* next_ = nullptr;
  std::size_t left_ = 0;
};

/// One opened PREFIX.idx / PREFIX.bin pair, checked.
class IndexedFile {
 public:
  /// Maps and checks `idx_path` and the .bin beside it; DataError naming the file and entry.
  /// With `copies`, a mapped .idx is read into them and its mapping closed once checked.
  explicit IndexedFile(const std::string& idx_path, IndexCopies* copies = nullptr);
  /// A remote pair: the .idx's cached copy `idx` (named `idx_url` in messages), and the .bin,
  /// object `bin_object` of `blocks`, read by range. Checks as the local one does.
  IndexedFile(std::shared_ptr<const CachePin> idx, const std::string& idx_url,
              const RemoteBlocks& blocks, std::size_t bin_object);

  DType dtype() const { return dtype_; }
  std::uint64_t sequences() const { return sequences_; }
  std::uint64_t documents() const { return documents_; }
  /// The mapped .bin of a local pair; null for a remote one and one read through a set.
  const MappedFile* mapped_bin() const { return bin_.get(); }
  /// The .bin's mapping, to hand to LocalMappings::keep (null where mapped_bin() is).
  std::shared_ptr<const MappedFile> bin_mapping() const { return bin_; }
  /// Closes the local .bin's mapping: its bytes are read through file `slot` of a
  /// MappedFileSet, set by use_set() before any read.
  void read_bin_through_set(std::size_t slot);
  /// The set read_bin_through_set() named a file of; ignored by any other pair.
  void use_set(const MappedFileSet* set);
  /// Whether the .bin is read through a MappedFileSet (its bytes then last on a thread until
  /// its next read of another file, as a remote .bin's do).
  bool in_set() const { return in_set_; }
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
  /// check_entries' rules checked with no branch per entry, over the entries as they are read
  /// (a chunk of the .idx at a time, while it is in the cache) or over the whole index at once.
  /// Only an index that breaks them goes through check_entries' loops, entry by entry, for the
  /// message naming its first bad entry.
  struct EntryScan {
    std::uint64_t sequences_done = 0;  ///< pairs (i, i + 1) of sequences checked: i below this
    std::uint64_t documents_done = 0;  ///< pairs (d, d + 1) of document entries checked
    std::uint64_t bad = 0;             ///< nonzero: some rule is broken
    std::uint64_t same = 1;            ///< every document entry d checked is d
    bool complete = false;             ///< every entry is checked (the first `idx_size_` bytes)
    bool identity = false;             ///< complete, and document d is sequence d
  };
  /// Checks the entries that lie in the first `read` bytes of the .idx at `base` and not yet
  /// in `scan`; the last call has read == idx_size_. Needs check_index() and the .bin's size.
  void scan_entries(const std::byte* base, EntryScan& scan, std::uint64_t read) const;
  /// Bytes [begin, end) of document `d` / sequence `i` in the .bin.
  std::pair<std::uint64_t, std::uint64_t> document_range(std::uint64_t d) const;
  /// Bytes [begin, end) of the .bin.
  std::span<const std::byte> bin_bytes(std::uint64_t begin, std::uint64_t end) const {
    if (bin_data_ == nullptr) [[unlikely]]
      return unmapped_bin_bytes(begin, end);
    return {bin_data_ + begin, static_cast<std::size_t>(end - begin)};
  }
  /// Bytes [begin, end) of a .bin not mapped for the run: remote, in a set, or empty.
  std::span<const std::byte> unmapped_bin_bytes(std::uint64_t begin, std::uint64_t end) const;
  std::int32_t length(std::uint64_t i) const;
  std::int64_t pointer(std::uint64_t i) const;
  std::int64_t doc(std::uint64_t d) const;
  /// Points idx_data_ at a copy of the .idx in huge pages (an index of 2 MiB up to 1/16 of the
  /// memory, read with pread), else at the mapping. Checking the index at open reads every entry
  /// and a shuffled epoch reads them in a random order: mapped in 4 KiB pages, each page's first
  /// touch faults (~1000 for 200 000 documents), and each lookup risks a TLB miss.
  void copy_index_into_huge_pages();
  /// Points idx_data_ at a copy of a mapped .idx in `copies` (read with pread); false when the
  /// file could not be read again as the one mapped (idx_data_ then stays on the mapping).
  bool copy_index_into(IndexCopies& copies);
  /// Reads the mapped .idx into `into` (read_mapped_file), scanning its entries as they come
  /// (scan_); false as read_mapped_file.
  bool read_into(std::byte* into);

  /// idx_: null once a copy holds the index; bin_: null for a remote .bin and one in a set.
  std::shared_ptr<const MappedFile> idx_, bin_;
  std::shared_ptr<const CachePin> idx_pin_;  ///< a remote .idx's cached copy, pinned
  const std::byte* bin_data_ = nullptr;      ///< the mapped .bin (local)
  const RemoteBlocks* blocks_ = nullptr;     ///< the remote .bin's reader, or null
  std::size_t bin_object_ = 0;               ///< the .bin among blocks_'s objects
  const MappedFileSet* set_ = nullptr;       ///< the set a local .bin is read through
  std::size_t set_slot_ = 0;                 ///< the .bin among set_'s files
  bool in_set_ = false;
  std::string bin_name_;
  std::uint64_t bin_size_ = 0;
  std::shared_ptr<std::byte> idx_copy_;  ///< the .idx's bytes in huge pages, or null
  /// The .idx's bytes: idx_copy_, a block of IndexCopies or the mapping.
  const std::byte* idx_data_ = nullptr;
  std::uint64_t idx_size_ = 0;
  DType dtype_ = DType::kUInt8;
  std::size_t item_ = 1;
  std::uint64_t sequences_ = 0;
  std::uint64_t documents_ = 0;
  /// The document index is 0, 1, ..., S (each sequence a document, as Megatron's and
  /// `flowstate gen`'s pre-training sets are): document d is sequence d, found without reading
  /// the document index (one cache miss per document of a shuffled order, not two).
  bool one_sequence_per_document_ = false;
  std::size_t lengths_at_ = 0, pointers_at_ = 0, docs_at_ = 0;  ///< byte offsets in .idx
  EntryScan scan_;  ///< of the copy made (complete), or of nothing yet
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
  /// False while remote files are read by blocks that the cache does not hold all of, and
  /// with local files read through a set.
  bool stable_records() const override { return !set_ && (!blocks_ || blocks_->holds_all()); }
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
  /// Opens and checks the local pair `named` (its .idx), counts its items and hands its
  /// mappings to `local`: kept for the run, or the .idx copied and the .bin read through set_.
  void add_local_pair(const ExpandedPath& named, LocalMappings& local);
  /// Refuses `f`, named `shown`, when its dtype is not the first pair's.
  void check_dtype(const IndexedFile& f, const std::string& shown) const;

  IndexedOptions options_;
  FieldId field_;
  /// Reads the remote .bin files by range; null when every file is local. Declared before
  /// files_data_, which point into it: destroyed after them.
  std::unique_ptr<RemoteBlocks> blocks_;
  /// With more local files than mapped_files_limit(): the .idx files' copies, and the set the
  /// .bin files are read through. Declared before files_data_, which point into them.
  IndexCopies index_copies_;
  std::unique_ptr<MappedFileSet> set_;
  std::vector<std::unique_ptr<IndexedFile>> files_data_;
  /// Maps the .bin files' pages in; joined by the destructor in the process that started it (a
  /// forked child's copy of the source leaves it: the thread stayed in the parent).
  std::unique_ptr<std::thread> populate_;
  pid_t populate_pid_ = 0;  ///< the process populate_ runs in
  std::atomic<bool> stop_populating_{false};
};

}  // namespace flowstate
