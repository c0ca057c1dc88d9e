// A read-only view of a whole file: memory-mapped, or — a small file — read into memory once.
// Errors name the file. A file that shrinks or vanishes while it is mapped does not kill the
// process: a guard catches the SIGBUS of a read past its new end, and the assembler reports it
// as a DataError (see check_mappings).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace flowstate {

/// What the file system said of a file when it was opened: which file it is (device, inode)
/// and when it last changed (mtime, ctime, in ns since the epoch). A file replaced by another
/// (renamed over, or copied elsewhere) has another identity even when its bytes agree.
struct FileStat {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  bool operator==(const FileStat&) const = default;
};

/// Files of at most this many bytes are read into memory when opened instead of mapped: a
/// mapping per file would hit the kernel's limit on mappings (vm.max_map_count, 65 530 by
/// default) at tens of thousands of files, and a small file takes no more memory read than
/// mapped (the kernel maps up to 64 KiB around each fault).
inline constexpr std::size_t kReadIntoMemoryBytes = std::size_t{64} << 10;

/// A file opened read-only: mapped, or, when it has at most kReadIntoMemoryBytes, read into
/// memory (one pread). Empty files take no memory. Immutable and thread-safe.
///
/// A read of a page the file no longer has (truncated or replaced under the run) raises SIGBUS;
/// flowstate's handler (installed with the first mapping, chaining to any handler before it)
/// puts a page of zeros there, remembers the first such offset, and lets the read go on. Every
/// batch is checked before it leaves the assembler (check_mappings): a batch made after such a
/// read fails with a DataError naming the file and the offset, never one holding the zeros.
class MappedFile {
 public:
  /// Opens `path`; throws DataError naming the file when it cannot be opened, read or mapped,
  /// and naming the offset when a small file ends before the size it had when opened.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  /// True when the bytes were read into memory (a small file), false when they are mapped.
  bool in_memory() const { return buffer_ != nullptr; }
  /// The file's identity on the file system when it was opened (fstat of the opened file).
  const FileStat& stat() const { return stat_; }
  /// The first offset a read found missing (the file shrank under the mapping), or kNoFault.
  std::uint64_t fault_offset() const { return fault_offset_.load(std::memory_order_acquire); }
  static constexpr std::uint64_t kNoFault = ~std::uint64_t{0};

 private:
  friend struct MappingRegistry;
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::unique_ptr<std::byte[]> buffer_;  ///< a small file's bytes (data_ points here)
  FileStat stat_;
  mutable std::atomic<std::uint64_t> fault_offset_{kNoFault};  ///< set by the SIGBUS guard
};

/// How many files are mapped now (MappedFile objects holding a mapping).
std::size_t live_mappings();

/// How many live mappings a read found cut short: 0 in a healthy process (one relaxed load,
/// polled per batch).
std::uint64_t faulted_mappings();

/// Throws a DataError naming the file and offset of the first live mapping a read found cut
/// short ("... changed while it was read ..."); returns when there is none.
void check_mappings();

/// A file a pattern matched.
struct ExpandedPath {
  std::string path;  ///< as opened (base_dir applied)
  /// The pattern's root as written — its directory part before the first wildcard — then the
  /// path below it: the same wherever base_dir, or an absolute root's directory, lies.
  /// A remote object's name is its URL (without credentials).
  std::string name;
  /// What must live while the file is read: a remote object's pin on its cached copy (see
  /// nodes/sources/object_cache.h); null for a local file.
  std::shared_ptr<const void> keep;
  /// A remote object's ETag as listed (quotes included; may be empty for HTTP); empty for a
  /// local file. Part of the object's data identity.
  std::string etag;
};

struct SourceRemote;  // nodes/sources/remote_options.h

/// expand_paths, with each file's name (see ExpandedPath). A remote pattern's objects are
/// reached and cached as `remote` says (a source's `cache` and `remote` options; null: the
/// job's defaults and the environment).
std::vector<ExpandedPath> expand_named_paths(const std::vector<std::string>& patterns,
                                             const std::filesystem::path& base_dir = {},
                                             const SourceRemote* remote = nullptr);

/// Expands `patterns` (plain paths or globs): each pattern's matches in sorted order,
/// a remote pattern (`s3://`, `http(s)://`) its objects, fetched into the local cache (see
/// expand_remote_paths),
/// patterns in the given order, duplicates dropped, flowstate's index caches (*.fsidx) left
/// out. A relative pattern is taken relative to `base_dir` when one is given (a YAML file's
/// directory). Throws DataError naming a pattern that matches nothing.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::filesystem::path& base_dir = {});

}  // namespace flowstate
