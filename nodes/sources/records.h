// `records` source: fixed-size records in one or more shard files, memory-mapped, with O(1)
// random access. Record i of the source is record (i - first_k) of file k, where files are
// taken in sorted order and first_k counts the records of the files before k.
//
//   RecordsOptions o{.paths = {"data/train-*.bin"}, .record_bytes = 1024};
//
// Writing: a records file is its records end to end, nothing else. The synthetic records of
// `flowstate gen records` — which the tests and benchmarks generate too — are made here, so
// every data set of that layout holds the same bytes:
//
//   write_synthetic_records("data/part-00000.bin", 0, 1000, 1024, /*seed=*/7);
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/read_plan.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/mapped_file_set.h"
#include "flowstate/nodes/sources/remote_blocks.h"
#include "flowstate/nodes/sources/remote_options.h"
#include "flowstate/nodes/sources/remote_window.h"

namespace flowstate {

/// Options of the `records` source.
struct RecordsOptions {
  std::vector<std::string> paths;  ///< files or globs; each glob's matches sorted
  std::size_t record_bytes = 0;    ///< bytes per record; required, > 0
  std::string field = "data";      ///< name of the uint8 [record_bytes] field in each sample
  /// Relative paths resolve against it (a YAML file's directory); not described, so a
  /// project directory can move together with its checkpoints.
  std::filesystem::path base_dir;
  FileVerify verify = FileVerify::kSampled;  ///< how a resume checks the files (free)
  /// Blocks of remote files held ahead of the reads (see RemoteBlocks; free: the data does
  /// not depend on it).
  std::size_t lookahead = kDefaultLookahead;
  CacheOptions cache;    ///< the local cache of remote files (free)
  RemoteOptions remote;  ///< how remote files are reached (free)

  static constexpr auto table() {
    using O = RecordsOptions;
    return std::tuple{
        param("paths", &O::paths, {.required = true, .doc = kPathsDoc, .check = check_paths}),
        param("record_bytes", &O::record_bytes,
              {.min = 1, .required = true, .doc = "bytes per record"}),
        param("field", &O::field, {.doc = "name of the uint8 [record_bytes] field of each sample"}),
        verify_param<O>(),
        lookahead_param<O>(),
        cache_param<O>(),
        remote_param<O>(),
    };
  }
};

/// The `records` source's definition.
const NodeDef& records_node();

/// The `records` source. Opening validates every file: an empty match, an unreadable file,
/// or a size that is not a multiple of record_bytes is a DataError naming the file. Local
/// files stay mapped for the run — unless there are more than mapped_files_limit() of them:
/// then those over 64 KiB are mapped as reads reach them, at most that many at once
/// (MappedFileSet; a file replaced since it was opened is a DataError naming it). Remote
/// files (`s3://`, `http(s)://`) are numbered from their listed sizes and downloaded as the
/// reads reach them, not when the source is built: by range, through RemoteBlocks (blocks of
/// FLOWSTATE_REMOTE_BLOCK bytes; every block from the first read on when the cache limit holds
/// them all, else `lookahead` blocks ahead of reads that progress), so a global shuffle over a
/// cache smaller than the data downloads blocks, not objects. The spine hands it the Refs of
/// the batches it plans (ReadPlanner), and their blocks download in that order ahead of the
/// reads (RemoteBlocks::plan).
class RecordsSource final : public FileSource, public ReadPlanner {
 public:
  RecordsSource(std::string name, RecordsOptions options, std::uint32_t source_id = 0);

  std::size_t record_bytes() const override { return options_.record_bytes; }
  std::span<const std::byte> record(const Ref& ref) const override;
  /// False while remote files are read by blocks that the cache does not hold all of, or
  /// local files through a MappedFileSet (more files than mapped_files_limit()).
  bool stable_records() const override { return !set_ && (!blocks_ || blocks_->holds_all()); }
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }
  /// True when some files are remote and RemoteBlocks plans (RemoteBlocks::plans).
  bool plans_reads() const override { return blocks_ && blocks_->plans(); }
  /// The remote records among `refs`, as byte ranges, to RemoteBlocks::plan.
  void plan_reads(std::span<const Ref> refs) const override;

 protected:
  void epoch_started(std::uint64_t epoch) override;

 private:
  RecordsOptions options_;
  FieldId field_;
  /// Null for a remote file and for a file of set_.
  std::vector<std::shared_ptr<const MappedFile>> maps_;
  std::vector<bool> in_set_;       ///< per file: read through set_
  std::vector<std::size_t> slot_;  ///< per file: its object in blocks_, or its file in set_
  /// The large local files, when there are more than mapped_files_limit() (null otherwise).
  std::unique_ptr<MappedFileSet> set_;
  /// The remote files, read by range (null when there are none).
  std::unique_ptr<RemoteBlocks> blocks_;
};

/// Fills `record` with synthetic record `index`: `index` as a little-endian uint64 (its low
/// bytes when the record is shorter than 8), then for the k-th further 8 bytes
/// philox64(seed, index, k), little-endian (the last one cut to the record's end). A reader
/// knows a record's position from its first 8 bytes.
void fill_synthetic_record(std::span<std::byte> record, std::uint64_t index, std::uint64_t seed);

/// Hands the synthetic records [begin, end) of `record_bytes` bytes each (see
/// fill_synthetic_record) to `write`, in order, in chunks of whole records of at most 8 MiB (at
/// least one record). Throws std::invalid_argument for a `record_bytes` of 0.
void generate_synthetic_records(std::uint64_t begin, std::uint64_t end, std::size_t record_bytes,
                                std::uint64_t seed,
                                const std::function<void(std::span<const std::byte>)>& write);

/// Writes the synthetic records [begin, end) to the records file `path`, replacing it. Throws
/// DataError naming the file (and the offset that failed) when it cannot be written.
void write_synthetic_records(const std::string& path, std::uint64_t begin, std::uint64_t end,
                             std::size_t record_bytes, std::uint64_t seed);

}  // namespace flowstate
