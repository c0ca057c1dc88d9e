// `tar` source: WebDataset-style tar shards. The members of each archive are grouped into
// samples, memory-mapped, with O(1) random access through a member index built once per file
// and cached beside it (`<file>.fsidx`, see nodes/sources/index_cache.h). Record i of the
// source is sample (i - first_k) of file k, files in sorted order.
//
// Grouping (the WebDataset rule): a member's key is its full path up to the first dot of its
// file name and its extension the rest ("dir/a.b.c" -> key "dir/a", extension "b.c");
// consecutive members with the same key form one sample, holding one field per extension:
// uint8 [member size], the member's bytes. Members whose file name has no dot, starts with
// one or ends with one belong to no sample and are skipped, as are directories, links and
// other non-regular members. A sample with two members of the same extension is a DataError.
//
// `fields` selects the extensions to read (others are ignored); a sample that lacks one of them
// is, per `on_missing`, an error when the source opens (DataError naming the file, the
// sample's key and the missing extension) or skipped (it is no record at all). Without
// `fields`, every extension seen is a field, and samples may differ in their fields.
//
// Archives are ustar, GNU or pax: headers are checksummed 512-byte blocks with octal (or GNU
// base-256) sizes; GNU long names ('L') and pax headers ('x': `path` and `size`) are honoured.
// Two zero blocks end an archive; a file may also just end, on a block boundary, after a
// complete member. Anything else — a bad checksum, a non-octal size, a member running past the
// end of the file, a partial header — is a DataError with the file and the byte offset of the
// offending header.
//
//   TarOptions o{.paths = {"shards/train-*.tar"}, .fields = {"jpg", "cls"},
//                .on_missing = MissingField::kSkip};
//
// Writing: append_tar_member and append_tar_end build an archive this source reads, in memory
// (`flowstate gen tar`, the tests' fixtures and the fuzzers' seeds all write through them):
//
//   std::string tar;
//   append_tar_member(tar, "000000042.tokens", "hello world");
//   append_tar_member(tar, "000000042.cls", "3");
//   append_tar_end(tar);
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flowstate/nodes/node.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/index_cache.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/mapped_file_set.h"
#include "flowstate/nodes/sources/remote_options.h"
#include "flowstate/nodes/sources/remote_window.h"

namespace flowstate {

/// What a `tar` source does with a sample that lacks one of its `fields`.
enum class MissingField : std::uint8_t {
  kError,  ///< the source fails to open, with a DataError naming the sample
  kSkip,   ///< the sample is left out: it is not a record
};
/// "error" or "skip".
std::string_view missing_field_name(MissingField m);
/// Parses a name given by missing_field_name; throws ConfigError (key `tar.on_missing`).
MissingField parse_missing_field(std::string_view name);

template <>
struct EnumNames<MissingField> {
  static constexpr std::array<std::pair<MissingField, const char*>, 2> values{
      {{MissingField::kError, "error"}, {MissingField::kSkip, "skip"}}};
};

/// Options of the `tar` source.
struct TarOptions {
  std::vector<std::string> paths;                  ///< files or globs; each glob's matches sorted
  std::vector<std::string> fields;                 ///< extensions to read; empty: every one seen
  MissingField on_missing = MissingField::kError;  ///< a sample lacking one of `fields`
  std::filesystem::path base_dir;            ///< relative paths resolve against it; not described
  FileVerify verify = FileVerify::kSampled;  ///< how a resume checks the files (free)
  /// Remote shards held ahead of the reads (see RemoteWindow; free).
  std::size_t lookahead = kDefaultLookahead;

  CacheOptions cache;    ///< the local cache of remote files (free)
  RemoteOptions remote;  ///< how remote files are reached (free)

  static constexpr auto table() {
    using O = TarOptions;
    return std::tuple{
        param("paths", &O::paths, {.required = true, .doc = kPathsDoc, .check = check_paths}),
        param("fields", &O::fields,
              {.doc = "the extensions read into fields", .default_doc = "every extension seen"}),
        param("on_missing", &O::on_missing,
              {.doc = "a sample lacking one of `fields`: error (when the source opens) or skip"}),
        verify_param<O>(),
        lookahead_param<O>(),
        cache_param<O>(),
        remote_param<O>(),
    };
  }
  /// The checks across options: no empty extension, none twice.
  void validate() const;
};

/// The `tar` source's definition.
const NodeDef& tar_node();

namespace detail {
/// One regular member of a tar file, as its cached index stores it.
struct TarMember {
  std::uint64_t start = 0;      ///< offset of its first header (long-name and pax included)
  std::uint64_t data = 0;       ///< offset of its bytes
  std::uint64_t size = 0;       ///< number of bytes
  std::uint64_t name = 0;       ///< offset of its path in the index's string table
  std::uint32_t name_size = 0;  ///< bytes of the path
  std::uint32_t key_size = 0;   ///< the key is the path's first key_size bytes; a dot follows
};
}  // namespace detail

/// The `tar` source. Opening maps every local file and loads (or builds and caches) its member
/// index: an empty match, an unreadable file or a malformed archive is a DataError naming the
/// file. Remote shards (`s3://`, `http(s)://`) are numbered from the job's object facts
/// (nodes/sources/remote_listing.h; at the job's first build each shard is read once, through
/// the window, to count its samples) and read through a RemoteWindow, their member index made
/// in memory each time the window fetches a copy. With more local files than
/// mapped_files_limit(), those over 64 KiB are closed once indexed and mapped again as reads
/// reach them, at most that many at once (MappedFileSet; a file replaced since is a DataError
/// naming it). Reading is thread-safe.
class TarSource final : public FileSource {
 public:
  TarSource(std::string name, TarOptions options, std::uint32_t source_id = 0);

  /// 0: samples vary in size.
  std::size_t record_bytes() const override { return 0; }
  /// The sample's raw tar bytes, from its first member's first header to the end of its last
  /// member's data; valid while the source lives (a remote shard's: on the calling thread
  /// until its next read of another remote file). Throws DataError for a foreign Ref.
  std::span<const std::byte> record(const Ref& ref) const override;
  /// Reads the sample's selected members into `sample`, one uint8 field per extension.
  void read(const Ref& ref, Sample& sample) const override;
  /// Unused (record_bytes() is 0): the first of `fields`, or "data".
  FieldId record_field() const override { return record_field_; }
  /// The bytes of the sample's member that lands in `field`, where they lie in the mapped tar;
  /// none for a remote shard (a view must stay valid while the source lives).
  std::optional<RecordView> view(const Ref& ref, FieldId field) const override;

  /// The sample's key ("dir/a"), as WebDataset's `__key__` (a remote shard's: valid as
  /// record()'s bytes are).
  std::string_view key(const Ref& ref) const;

 protected:
  void epoch_started(std::uint64_t epoch) override;

 private:
  /// What the source keeps of one tar file (of a remote one: what the window keeps with a
  /// copy, `map` null; of a file of set_: all but `map`).
  struct Shard {
    std::shared_ptr<const MappedFile> map;
    FileIndex<detail::TarMember> index;
    std::vector<FieldId> member_fields;  ///< per member: its field, or kNoField when ignored
    std::vector<std::pair<std::uint64_t, std::uint64_t>> samples;  ///< per record: members
  };
  static constexpr FieldId kNoField = ~FieldId{0};

  /// Groups the members of `shard` into records, applying `fields` and `on_missing`.
  void group(Shard& shard, const std::string& file) const;
  /// Where a record lies: its shard's bytes, the shard, and the record's members in it.
  struct Located {
    const std::byte* data;
    const Shard* shard;
    std::pair<std::uint64_t, std::uint64_t> members;
  };
  /// Where `ref` lies; throws DataError for a foreign Ref (or a remote shard that fails).
  Located members_of(const Ref& ref) const;
  /// The index and samples of remote shard `k` (in window_) from its copy: a DataError naming
  /// the URL for a malformed archive, or for a count other than the job's facts say.
  std::shared_ptr<const Shard> prepare_remote(std::size_t k, const MappedFile& copy) const;

  TarOptions options_;
  FieldId record_field_;
  std::vector<FieldId> field_ids_;  ///< the ids of options_.fields
  std::vector<Shard> shards_;       ///< per file; a remote file's is empty
  std::vector<bool> in_set_;        ///< per file: read through set_
  std::vector<std::size_t> slot_;   ///< per file: its object in window_, or its file in set_
  /// Per remote object its samples as the job's facts say (kItemsUnknown until they are
  /// known): read by prepare_remote on the window's threads.
  std::vector<std::atomic<std::uint64_t>> expected_;
  std::unique_ptr<RemoteWindow> window_;  ///< the remote shards; null when there are none
  /// The large local files, when there are more than mapped_files_limit() (null otherwise).
  std::unique_ptr<MappedFileSet> set_;
};

/// Bytes of a tar block: a header is one block, a member's data is padded to whole blocks.
inline constexpr std::size_t kTarBlockBytes = 512;

/// What append_tar_header writes into one header block.
struct TarHeader {
  std::string_view name;    ///< the path (its last part, with `prefix`): at most 100 bytes
  std::uint64_t size = 0;   ///< bytes of the member's data: less than 8 GiB (11 octal digits)
  char type = '0';          ///< '0' a file, '5' a directory, 'L' a GNU long name, 'x' pax, ...
  std::string_view prefix;  ///< ustar: the path's directories before `name`, at most 155 bytes
  bool gnu = false;         ///< GNU's magic "ustar  " (no prefix), not POSIX's "ustar" "00"
};

/// Appends the header block of `header` to `out`: mode 0644 (0755 for a directory), owner 0,
/// mtime 0 — so an archive's bytes depend on its members alone — device numbers 0 and the
/// checksum. Throws std::invalid_argument when a field does not fit.
void append_tar_header(std::string& out, const TarHeader& header);
/// Appends a member's data: `data`, then NULs to the end of its last block.
void append_tar_data(std::string& out, std::string_view data);
/// Appends the regular file `name` (at most 100 bytes) holding `data`: a POSIX ustar header,
/// then the data. Throws std::invalid_argument for a longer name.
void append_tar_member(std::string& out, std::string_view name, std::string_view data);
/// Appends the end of an archive: two zero blocks.
void append_tar_end(std::string& out);
/// Stores the checksum of `header` computed from its other fields: six octal digits, a NUL and
/// a space, as GNU tar and Python's tarfile write it.
void seal_tar_header(std::span<char, kTarBlockBytes> header);

}  // namespace flowstate
