// `lines` source: text or JSON Lines files, one record per line, memory-mapped, with O(1)
// random access through a byte-offset index built once per file and cached beside it
// (`<file>.fsidx`, see nodes/sources/index_cache.h). Record i of the source is line
// (i - first_k) of file k, where files are taken in sorted order and first_k counts the records
// of the files before k.
//
// A line ends at '\n' or at the end of the file (a last line needs no newline; a file ending
// in '\n' has no empty line after it). A line's trailing '\r' is dropped, so CRLF files read
// like LF ones. With `skip_empty`, lines with no bytes (after that) are not records; lines of
// spaces are.
//
// Text: each sample holds `field` = uint8 [line length], the line's bytes.
// JSON Lines: each line is parsed when it is read. With `json_fields`, each named top-level
// key becomes a field of the same name: an integer an int64 scalar, a float a float64
// scalar, a boolean a uint8 scalar (0 or 1), a string uint8 [bytes], an array of numbers a
// 1-D int64 tensor (all integers) or float64 tensor. Without `json_fields`, the line is
// checked to parse and lands as bytes in `field`. A line that is not valid JSON, lacks a
// selected key or holds a value of another type (object, null, array of non-numbers, an
// integer outside int64) is a DataError with the file, the line's byte offset and its 1-based
// line number.
//
//   LinesOptions o{.paths = {"corpus/*.jsonl"}, .format = LinesFormat::kJsonl,
//                  .json_fields = {"text", "label"}};
//
// Writing: append_line and append_jsonl_tokens build a file this source reads, in memory
// (`flowstate gen lines` and the tests' fixtures write through them):
//
//   std::string text;
//   append_line(text, "one");
//   const std::vector<std::int64_t> tokens{5, 7};
//   append_jsonl_tokens(text, 42, tokens);  // {"id": 42, "tokens": [5, 7]}
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/nodes/node.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/mapped_file_set.h"
#include "flowstate/nodes/sources/remote_options.h"
#include "flowstate/nodes/sources/remote_window.h"

namespace flowstate {

/// How a `lines` source reads each line.
enum class LinesFormat : std::uint8_t {
  kText,   ///< the line's bytes
  kJsonl,  ///< a JSON value per line (JSON Lines)
};
template <>
struct EnumNames<LinesFormat> {
  static constexpr std::array<std::pair<LinesFormat, const char*>, 2> values{
      {{LinesFormat::kText, "text"}, {LinesFormat::kJsonl, "jsonl"}}};
};
/// "text" or "jsonl".
std::string_view lines_format_name(LinesFormat format);
/// Parses a name given by lines_format_name; throws ConfigError (key `lines.format`) otherwise.
LinesFormat parse_lines_format(std::string_view name);

/// Options of the `lines` source.
struct LinesOptions {
  std::vector<std::string> paths;            ///< files or globs; each glob's matches sorted
  LinesFormat format = LinesFormat::kText;   ///< text or jsonl
  std::string field = "text";                ///< the bytes field (text; jsonl without json_fields)
  bool skip_empty = false;                   ///< empty lines are not records
  std::vector<std::string> json_fields;      ///< jsonl: top-level keys to read, each a field
  std::filesystem::path base_dir;            ///< relative paths resolve against it; not described
  FileVerify verify = FileVerify::kSampled;  ///< how a resume checks the files (free)
  /// Remote files held ahead of the reads (see RemoteWindow; free).
  std::size_t lookahead = kDefaultLookahead;

  CacheOptions cache;    ///< the local cache of remote files (free)
  RemoteOptions remote;  ///< how remote files are reached (free)

  static constexpr auto table() {
    using O = LinesOptions;
    return std::tuple{
        param("paths", &O::paths, {.required = true, .doc = kPathsDoc, .check = check_paths}),
        param("format", &O::format,
              {.doc = "text (the line's bytes) or jsonl (a JSON value per line)"}),
        param("field", &O::field,
              {.doc = "the uint8 field holding the line (text, or jsonl without json_fields)"}),
        param("skip_empty", &O::skip_empty, {.doc = "empty lines are not records"}),
        param("json_fields", &O::json_fields,
              {.doc = "jsonl: top-level keys read into fields of the same name",
               .default_doc = "none: the whole line in `field`"}),
        verify_param<O>(),
        lookahead_param<O>(),
        cache_param<O>(),
        remote_param<O>(),
    };
  }
  /// The checks across options: a field name, json_fields only for jsonl, no name twice.
  void validate() const;
};

/// The `lines` source's definition.
const NodeDef& lines_node();

/// The `lines` source. Opening maps every local file and loads (or builds and caches) its
/// index: an empty match or an unreadable file is a DataError naming the path; options that
/// do not fit together are a ConfigError. With more local files than mapped_files_limit(),
/// those over 64 KiB are closed once indexed and mapped again as reads reach them, at most that
/// many at once (MappedFileSet; a file replaced since is a DataError naming it). Remote files
/// (`s3://`, `http(s)://`) are numbered from the job's object facts
/// (nodes/sources/remote_listing.h; at the job's first build each is read once, through the window,
/// to count its lines) and read through a RemoteWindow, their line index made in memory each time
/// the window fetches a copy. Reading is thread-safe.
class LinesSource final : public FileSource {
 public:
  LinesSource(std::string name, LinesOptions options, std::uint32_t source_id = 0);

  /// 0: lines vary in size.
  std::size_t record_bytes() const override { return 0; }
  /// The line's bytes, without its newline or '\r'; valid while the source lives (a remote
  /// file's, or one of the set's: on the calling thread until its next read of another
  /// file). Throws DataError for a Ref that is not one of this source's.
  std::span<const std::byte> record(const Ref& ref) const override;
  /// Reads the line into `sample` as the format says; throws DataError (see above).
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }
  /// Plain text: the line's bytes where they lie in the mapped file (JSON Lines, a remote
  /// file, a file of the set: none).
  std::optional<RecordView> view(const Ref& ref, FieldId field) const override;
  /// "'FILE' line L (byte B): what".
  [[noreturn]] void fail_record(const Ref& ref, const std::string& what) const override;

 protected:
  void epoch_started(std::uint64_t epoch) override;

 private:
  /// File k's bytes and line index (a remote file's: valid as record()'s bytes are).
  struct Text {
    const std::byte* data;
    std::uint64_t size;
    const std::vector<std::uint64_t>* starts;
  };
  Text text(std::size_t k) const;
  /// The line index of remote file `k` (in window_) from its copy: a DataError naming the URL
  /// for a count other than the job's facts say.
  std::shared_ptr<const std::vector<std::uint64_t>> prepare_remote(std::size_t k,
                                                                   const MappedFile& copy) const;
  /// The line starting at byte `begin` of file k, without its newline or '\r'.
  std::span<const std::byte> line(std::size_t k, std::uint64_t begin) const;
  /// The 1-based number of the line starting at `offset` of file k (counts newlines).
  std::uint64_t line_number(std::size_t k, std::uint64_t offset) const;
  /// Throws a DataError "'FILE' line N (byte OFFSET): what".
  [[noreturn]] void fail(std::size_t k, std::uint64_t offset, const std::string& what) const;
  /// Reads the JSON line at byte `offset` of file k into `sample`.
  void read_json(std::size_t k, std::uint64_t offset, std::span<const std::byte> bytes,
                 Sample& sample) const;

  LinesOptions options_;
  FieldId field_;
  std::vector<FieldId> json_ids_;  ///< the ids of options_.json_fields
  /// Null for a remote file and for a file of set_.
  std::vector<std::shared_ptr<const MappedFile>> maps_;
  std::vector<bool> in_set_;  ///< per file: read through set_
  /// Per file: byte offset of each record, the top bit set when its line ends with "\r\n"
  /// (a remote file's: empty; the window keeps it with the copy).
  std::vector<std::vector<std::uint64_t>> starts_;
  std::vector<std::size_t> slot_;  ///< per file: its object in window_, or its file in set_
  /// Per remote object its lines as the job's facts say (kItemsUnknown until they are known).
  std::vector<std::atomic<std::uint64_t>> expected_;
  std::unique_ptr<RemoteWindow> window_;  ///< the remote files; null when there are none
  /// The large local files, when there are more than mapped_files_limit() (null otherwise).
  std::unique_ptr<MappedFileSet> set_;
};

/// How append_line ends a line.
enum class LineEnd : std::uint8_t {
  kLf,    ///< "\n"
  kCrLf,  ///< "\r\n" (read like "\n")
  kNone,  ///< nothing: the last line of a file that does not end with a newline
};

/// Appends `line` to `out` as one line of a text or JSON Lines file, ended as `end` says.
/// Throws std::invalid_argument when the line holds a '\n' (it would read as two) or ends
/// with '\r' (the source would drop it).
void append_line(std::string& out, std::string_view line, LineEnd end = LineEnd::kLf);

/// Appends the JSON Lines line {"id": ID, "tokens": [T, T, ...]} and its "\n" to `out`: a
/// document of `flowstate gen lines --jsonl`, which a `lines` source with json_fields
/// {id, tokens} reads as an int64 scalar and a 1-D int64 tensor.
void append_jsonl_tokens(std::string& out, std::uint64_t id, std::span<const std::int64_t> tokens);

/// Appends the JSON Lines line {"text": "..."} and its "\n" to `out`: `text` (UTF-8) as a JSON
/// string, '"', '\\' and control characters escaped, which a `lines` source with json_fields
/// {text} reads back as its bytes (uint8). A document of `flowstate gen text`.
void append_jsonl_text(std::string& out, std::string_view text);

/// Document `index` of the synthetic text corpus of `seed` (`flowstate gen text`): English-
/// looking prose — sentences of 3 to 24 words drawn with Zipf frequencies from a vocabulary of
/// common English words and made-up ones (a few with accents or digits), capitalized and
/// punctuated, in paragraphs separated by "\n\n" — of a lognormal number of words (median
/// `median_words`, sigma 0.5, 1 to 20 × the median). A pure function of (seed, index,
/// median_words).
std::string synthetic_text(std::uint64_t seed, std::uint64_t index, std::uint64_t median_words);

}  // namespace flowstate
