// FileSource: what every file-backed source (records, lines, tar) shares — records numbered
// across files in order (record i of the source is record i - first_k of file k), O(1)
// random access, a cursor, and the identity of the data it opened (DESIGN.md §6 "Data
// identity"): per file its name, size, item count and the hashes of a few sampled blocks,
// computed once when the source opens and compared on restore. A derived source opens its
// files in its constructor, calling add_file() once per file in order, and reads records by Ref;
// its definition is one call of define_file_source.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <cereal/types/string.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/state_blob.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"
#include "flowstate/nodes/sources/mapped_file.h"

namespace flowstate {

/// The check of a source's `paths` option: at least one path, none empty.
std::string check_paths(const ParamValue& value);
/// The doc of a source's `paths` option.
inline constexpr const char* kPathsDoc =
    "files or globs, each glob's matches in sorted order; relative to the YAML file";
/// A uint8 [size] tensor holding a copy of `size` bytes at `data` (samples are writable, so
/// they never view a read-only mapping).
Tensor bytes_tensor(const void* data, std::size_t size);

/// Bytes per sampled block of a data file's identity.
inline constexpr std::size_t kIdentityBlockBytes = 4096;
/// Blocks sampled per file: the first, two at offsets drawn from the file's name and size, and
/// the last.
inline constexpr std::size_t kIdentityBlocks = 4;

/// How a file source checks, on restore, that its files are the ones the checkpoint read (the
/// `verify` option of every file source; free: it may change between save and restore).
enum class FileVerify : std::uint8_t {
  /// Size, item count, sampled blocks, and the file system's identity (device, inode, mtime,
  /// ctime): a file replaced since the checkpoint is refused even when the sampled blocks
  /// agree — and so is a copy of the data directory (the message says how to accept one).
  kSampled,
  /// kSampled, plus a hash of each file's whole content, read when the source opens: a file
  /// whose file-system identity changed (a copied or moved data directory) is accepted when
  /// its whole content agrees with the checkpoint's, refused otherwise.
  kFull,
  /// Size, item count and sampled blocks only (the check before issue 23): a copy resumes
  /// without a full read, and so would a replaced file whose change misses the sampled blocks.
  kBlocks,
};
template <>
struct EnumNames<FileVerify> {
  static constexpr std::array<std::pair<FileVerify, const char*>, 3> values{
      {{FileVerify::kSampled, "sampled"},
       {FileVerify::kFull, "full"},
       {FileVerify::kBlocks, "blocks"}}};
};
/// The doc of a file source's `verify` option.
inline constexpr const char* kVerifyDoc =
    "how a resume checks the files are the checkpoint's: sampled (size, count, 4 sampled blocks "
    "and the file system's inode/mtime/ctime: a replaced or copied file is refused), full "
    "(sampled plus a hash of every file's whole content, read when the source opens: a copied "
    "data directory resumes when its bytes agree), blocks (size, count, sampled blocks only)";
/// The `verify` row of a file source's options table (`O::verify`, a FileVerify).
template <class O>
constexpr auto verify_param() {
  // Described only when not the default: a pipeline's description reads as before.
  return param("verify", &O::verify,
               {.free = true, .doc = kVerifyDoc, .describe_if = [](const O& o) {
                  return o.verify != FileVerify::kSampled;
                }});
}

/// One data file as a checkpoint records it.
struct FileIdentity {
  /// The pattern's root as written (its directory part before the first wildcard), then the
  /// path below that root: "data/part-00001.bin" — the same wherever the data directory lies.
  std::string name;
  std::uint64_t bytes = 0;                              ///< the file's size
  std::uint64_t items = 0;                              ///< records, lines or samples
  std::array<std::uint64_t, kIdentityBlocks> blocks{};  ///< XXH3-64 of each sampled block
  /// What the file system said of the file (absent in identities written before issue 23).
  std::optional<FileStat> stat;
  /// XXH3-64 of the whole file (`verify: full`), else absent.
  std::optional<std::uint64_t> full;
  /// A remote object's ETag as its server listed it (quotes included), else absent: with the
  /// URL as the name and the size, what identifies the object.
  std::optional<std::string> etag;
  bool operator==(const FileIdentity&) const = default;
};

/// The data a file source read: its files in record order. Immutable once the source opened.
struct DataIdentity {
  std::vector<FileIdentity> files;
  /// Version 2 adds per file a byte of flags (1: a FileStat follows, 2: a whole-file hash,
  /// 4: an ETag — after issue 23's ETag identity; a file without one reads as before).
  template <class Archive>
  void save(Archive& ar, std::uint32_t) const {
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(files.size())));
    for (const auto& f : files) {
      ar(f.name, f.bytes, f.items);
      for (auto b : f.blocks) ar(b);
      ar(static_cast<std::uint8_t>((f.stat ? 1 : 0) | (f.full ? 2 : 0) | (f.etag ? 4 : 0)));
      if (f.stat) ar(f.stat->device, f.stat->inode, f.stat->mtime_ns, f.stat->ctime_ns);
      if (f.full) ar(*f.full);
      if (f.etag) ar(*f.etag);
    }
  }
  template <class Archive>
  void load(Archive& ar, std::uint32_t version) {
    require_state_version("DataIdentity", version, 2);
    // A file takes at least 56 bytes: a corrupt count must not allocate more than the input.
    const std::uint64_t n = load_bounded_size(ar);
    if (n > StateReadLimit::current() / 56)
      throw std::length_error("the data identity says " + std::to_string(n) +
                              " files, more than its input can hold");
    files.resize(static_cast<std::size_t>(n));
    for (auto& f : files) {
      load_bounded(ar, f.name);
      ar(f.bytes, f.items);
      for (auto& b : f.blocks) ar(b);
      if (version < 2) continue;
      std::uint8_t flags = 0;
      ar(flags);
      if (flags > 7)
        throw std::runtime_error("unexpected flags " + std::to_string(flags) + " of data file '" +
                                 f.name + "' in a data identity");
      if (flags & 1) {
        FileStat st;
        ar(st.device, st.inode, st.mtime_ns, st.ctime_ns);
        f.stat = st;
      }
      if (flags & 2) {
        std::uint64_t h = 0;
        ar(h);
        f.full = h;
      }
      if (flags & 4) {
        std::string etag;
        load_bounded(ar, etag);
        f.etag = std::move(etag);
      }
    }
  }
};

/// The offsets of the blocks sampled from a file of `bytes` bytes named `name` (see
/// FileIdentity): fixed by the name and size, so a restore samples the same blocks.
std::array<std::uint64_t, kIdentityBlocks> identity_offsets(const std::string& name,
                                                            std::uint64_t bytes);
/// The identity of one opened file: reads kIdentityBlocks blocks of at most 4 KiB, takes the
/// file system's identity the file was opened with, and with `full` hashes the whole file.
FileIdentity file_identity(std::string name, const MappedFile& file, std::uint64_t items,
                           bool full = false);
/// The differences between the identity in a checkpoint and the files opened now, one line
/// each ("data/part-00002.bin was in the checkpoint and is gone"); empty when they agree.
/// `unit` names the items ("records"); `verify` is the source's option now (see FileVerify).
std::vector<std::string> identity_differences(const DataIdentity& saved, const DataIdentity& now,
                                              const std::string& unit,
                                              FileVerify verify = FileVerify::kBlocks);

/// A file source's state: the cursor, and the identity of its data, shared by every snapshot
/// (a snapshot per batch is a reference count, not a copy).
///
/// On disk it is a CursorState (version 1, the whole state before data identity), then a byte
/// saying what follows: 2 and the DataIdentity as a state blob (core/state_blob.h: a string
/// holding a marker, the size and XXH3-64 of the payload, and the payload, the DataIdentity's
/// own archive), which a checkpoint directory stores once for all its steps; or 1 and the
/// DataIdentity inline (written before issue 23; still read). A state that ends after its
/// CursorState — written before identities were recorded — restores with no identity, so
/// nothing is compared.
struct FileSourceState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;                      ///< Refs emitted in this epoch
  std::shared_ptr<const DataIdentity> identity;  ///< null: none recorded
  /// The files this epoch started with, when the run continued over files added to or
  /// removed from the glob during it (FileSource::restore, DataChange::files); null otherwise.
  /// On disk the identity's byte is 4 instead of 2, and `changed_at` and this identity (a blob
  /// too) follow it (a file source's entry delimits itself: it may be followed by other nodes'
  /// states).
  std::shared_ptr<const DataIdentity> epoch_files;
  std::uint64_t changed_at = 0;  ///< the cursor when the files changed (with epoch_files)
  /// `identity` as a state blob: its own archive wrapped by wrap_blob.
  template <class Archive>
  static std::string identity_blob(const DataIdentity& identity) {
    std::ostringstream os(std::ios::binary);
    {
      Archive inner(os);
      inner(identity);
    }
    return wrap_blob(os.view());
  }
  /// Reads a blob written by identity_blob into `out`.
  template <class Archive>
  static void load_identity_blob(Archive& ar, DataIdentity& out) {
    std::string blob;
    load_bounded(ar, blob);
    const std::string_view payload = unwrap_blob(blob);
    std::istringstream is{std::string(payload), std::ios::binary};
    StateReadLimit limit(payload.size());
    InArchive inner(is);
    inner(out);
  }
  template <class Archive>
  void save(Archive& ar) const {
    ar(CursorState{epoch, cursor});
    if (!identity) return;
    ar(static_cast<std::uint8_t>(epoch_files ? 4 : 2), identity_blob<Archive>(*identity));
    if (epoch_files) ar(changed_at, identity_blob<Archive>(*epoch_files));
  }
  /// Reads a state from an archive holding its entry alone (the optional identity ends it).
  template <class Archive>
  void load(Archive& ar) {
    CursorState c;
    ar(c);
    epoch = c.epoch;
    cursor = c.cursor;
    identity = nullptr;
    std::uint8_t more = 0;
    try {
      ar(more);
    } catch (const cereal::Exception&) {
      return;  // the entry ends here: written before identities were recorded
    }
    auto loaded = std::make_shared<DataIdentity>();
    if (more == 1) {
      ar(*loaded);
    } else if (more == 2 || more == 4) {
      load_identity_blob(ar, *loaded);
    } else {
      throw std::runtime_error("unexpected byte " + std::to_string(more) +
                               " after the cursor of a file source");
    }
    identity = std::move(loaded);
    epoch_files = nullptr;
    changed_at = 0;
    if (more == 4) {  // the epoch continues over the files it started with
      auto files = std::make_shared<DataIdentity>();
      ar(changed_at);
      load_identity_blob(ar, *files);
      epoch_files = std::move(files);
    }
  }
};

/// How the epoch in progress reads the files it started with after files were added to or
/// removed from the glob (FileSource::restore): its positions, in spans of the epoch's files'
/// own record numbers, and where each of those files is now.
struct FileEpochView {
  /// Positions [at, at + count) of the epoch are its files' records [from, from + count).
  struct Span {
    std::uint64_t at = 0, from = 0, count = 0;
  };
  static constexpr std::uint32_t kGone = ~std::uint32_t{0};
  std::uint64_t epoch = 0;
  std::uint64_t size = 0;            ///< positions in the epoch
  std::vector<Span> spans;           ///< in order of position
  std::vector<std::uint64_t> first;  ///< the epoch's files' first record numbers, plus the total
  std::vector<std::uint32_t> now;    ///< each of the epoch's files' number now, or kGone
};

/// The InspectFn of file sources: epoch, cursor and, when recorded, the files (name, bytes,
/// items, hash).
std::string inspect_file_source(InArchive& ar, const InspectContext& ctx);

/// The base of file-backed sources. Not thread-safe in its spine part; `local()` is.
class FileSource : public StatefulSpineNode<FileSourceState>, public RecordStore {
 public:
  /// `kind` names the source in messages ("records"); `unit` its items ("records", "lines");
  /// `source_id` goes into its Refs.
  FileSource(std::string name, std::string kind, std::string unit, std::uint32_t source_id);

  /// What pull() delivers in `epoch`: in an epoch that continues over files removed, the
  /// records before the change and the kept files' records after it.
  std::uint64_t size(std::uint64_t epoch) const final {
    return view_ && epoch == view_->epoch ? view_->size : total_;
  }
  /// In an epoch that continues over a change of its files, all the records of the files it
  /// started with, numbered as they were (a removed file's are gone: at() answers
  /// Ref::gone()); else size().
  std::uint64_t positions(std::uint64_t epoch) const final {
    return view_ && epoch == view_->epoch ? view_->first.back() : total_;
  }
  bool indexed() const final { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const final;
  void start_epoch(std::uint64_t epoch) final;
  std::size_t pull(std::span<Ref> out) final;
  /// Loads the cursor and, when the state recorded one, compares the data's identity with the
  /// files opened: a difference is a CheckpointError listing each, one per line — unless the
  /// restore opted in (DataChange::current()->files) and the files were only added to or
  /// removed from the glob, which continue by continue_over_files' rules.
  void restore(InArchive& ar) final;
  /// A first-format stamp holds a CursorState alone (no identity).
  void restore_legacy(InArchive& ar) final;

  /// The files, in record order: their paths, a remote object's URL.
  const std::vector<std::string>& files() const { return files_; }
  /// The source id in this source's Refs.
  std::uint32_t source_id() const { return source_id_; }
  /// Throws a DataError about the record `ref` (one of this source's) that names where it
  /// lies — "'FILE' record N: what" (N counted from 0 in the file), a `lines` source "'FILE'
  /// line L (byte B): what" — for a node after the source that cannot work on the record
  /// (tokenize).
  [[noreturn]] virtual void fail_record(const Ref& ref, const std::string& what) const;

 protected:
  /// Appends the next file, holding `records` records, and records its identity under `name`
  /// (see FileIdentity) from the mapped bytes.
  void add_file(const ExpandedPath& path, const MappedFile& file, std::uint64_t records);
  /// Appends the next file, a remote object opened lazily (nodes/sources/remote_window.h), by
  /// its listing alone: `url` names it (in messages and the identity), `bytes` and `etag` are
  /// the listed size and ETag. Its identity's sampled blocks are hashes of the ETag (the bytes
  /// are not at hand; the server's hash of them stands in), and the ETag is recorded too, so a
  /// changed object is refused on resume naming both ETags; it records no stat, and
  /// `verify: full` hashes nothing more.
  void add_remote_file(const std::string& url, std::uint64_t bytes, const std::string& etag,
                       std::uint64_t records);
  /// Appends the next file, a remote object opened lazily whose bytes were read once (the
  /// job's object facts, nodes/sources/remote_listing.h): its identity is the one add_file
  /// records for a cached copy — the sampled `blocks` of its bytes, the ETag, no stat, and
  /// under FileVerify::kFull the whole-content hash `full`.
  void add_remote_file(const std::string& url, std::uint64_t bytes, const std::string& etag,
                       std::uint64_t records,
                       const std::array<std::uint64_t, kIdentityBlocks>& blocks,
                       std::uint64_t full);
  /// The spine started epoch `epoch` (start_epoch; not on a restore): a source that reads
  /// ahead learns its reads start over. Records of the epoch before may still be read after.
  virtual void epoch_started(std::uint64_t /*epoch*/) {}
  /// Sets how restore checks the files (the source's `verify` option); call before add_file,
  /// which hashes whole files under FileVerify::kFull.
  void set_verify(FileVerify verify) { verify_ = verify; }
  /// The index of `ref` within its file; throws DataError naming the file for a Ref that is
  /// not one of this source's. Inline: the gather fast path calls it twice per record.
  std::uint64_t local(const Ref& ref) const {
    const std::size_t k = ref.shard;
    if (k >= files_.size() || ref.index < first_[k] || ref.index >= first_[k + 1]) [[unlikely]]
      out_of_range(ref);
    return ref.index - first_[k];
  }
  void validate(const FileSourceState& s) const final;
  [[noreturn]] void out_of_range(const Ref& ref) const;

  /// The state `s`, whose identity differs from the files opened by `diffs`, carried over to
  /// them (file_change.cpp): the epoch in progress finishes over the files it started with
  /// (less the unread records of files removed), the next reads the files now. Notes what it
  /// did in the current DataChange; throws CheckpointError when the restore did not opt in or
  /// the change cannot continue exactly.
  FileSourceState continue_over_files(FileSourceState s,
                                      const std::vector<std::string>& diffs) const;
  /// The view of `s`'s epoch over `s.epoch_files` (file_change.cpp).
  std::shared_ptr<const FileEpochView> epoch_view(const FileSourceState& s) const;
  /// The `i`-th record the cursor delivers in the view's epoch (the epoch's records before
  /// the change, then the kept files' records), numbered as now.
  Ref view_at(std::uint64_t i) const;
  /// Position `i` of the view's epoch (record i of the files it started with), numbered as
  /// now; Ref::gone() for a removed file's record.
  Ref position_at(std::uint64_t i) const;

  std::uint32_t source_id_;
  std::vector<std::string> files_;

 private:
  std::string kind_;
  std::string unit_;
  FileVerify verify_ = FileVerify::kSampled;
  std::shared_ptr<DataIdentity> identity_ = std::make_shared<DataIdentity>();
  std::vector<std::uint64_t> first_{0};  ///< first global index of each file, plus the total
  std::vector<std::shared_ptr<const void>> keep_;  ///< each file's ExpandedPath::keep
  std::uint64_t total_ = 0;
  /// The epoch that finishes over the files it started with (see continue_over_files); null
  /// when every epoch reads the files opened.
  std::shared_ptr<const FileEpochView> view_;
};

/// The build function of a file source `Source` (constructed as Source(name, options, id)).
template <class Source, class Options>
void add_file_source(BuildContext& ctx, const Options& options) {
  auto node = std::make_unique<Source>(ctx.name(), options, ctx.source_id());
  const RecordStore* store = node.get();
  ctx.add_store(std::move(node), store);
}

/// The definition of a file source: `Source`, constructed as Source(name, options, source_id),
/// with the options `Options` (their table gives its parameters), built by add_file_source
/// and inspected by inspect_file_source. Its phase is Phase::kSource, whatever `info` says.
///
///   const NodeDef& records_node() {
///     static const NodeDef def = define_file_source<RecordsSource, RecordsOptions>(
///         {.type = "records", .doc = "fixed-size records in shard files"});
///     return def;
///   }
template <class Source, OptionsTable Options>
NodeDef define_file_source(NodeInfo info) {
  info.phase = Phase::kSource;
  return define_node<Options>(
      std::move(info), [](BuildContext& ctx, const Options& o) { add_file_source<Source>(ctx, o); },
      inspect_file_source);
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::DataIdentity, 2);
