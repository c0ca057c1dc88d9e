// Local files too many to keep mapped at once: a bounded set of mappings over them, opened as
// reads reach a file and closed least recently used first (issue 23: "100 000 local files
// work"). A mapping per file held for the run hit the kernel's limit on mappings per process
// (vm.max_map_count, 65 530 by default) at the 65 531st file of more than 64 KiB.
//
//   MappedFileSet set(files, mapped_files_limit());
//   std::span<const std::byte> r = set.read(k, offset, bytes);  // valid until this thread's
//                                                              // next read of another file
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"

namespace flowstate {

/// How many of its local files a source keeps mapped for the whole run: a source with more
/// files than this reads them through a MappedFileSet of this many mappings instead.
/// FLOWSTATE_MAPPED_FILES (a positive integer), else a quarter of the kernel's
/// vm.max_map_count (16 382 of its default 65 530), so four such sources and the process's own
/// mappings fit. Throws ConfigError naming the variable for a value that is not a positive
/// integer.
std::size_t mapped_files_limit();

/// At most `limit` of `files` mapped at once. A read maps its file when no mapping of it is
/// held, after checking that the file is still the one the source opened (its size, device,
/// inode, mtime and ctime): a file replaced or changed since is a DataError naming it, never
/// bytes of another file. When the set holds `limit` mappings, the one read least recently
/// (by a clock's second chance) is closed first — except a mapping whose file was cut short
/// under a read (MappedFile's SIGBUS guard), which stays so that check_mappings() reports it.
/// A mapping closed by the set stays readable by a thread still holding it: each thread holds
/// the mapping of its last read until its next read of another file, so the process holds at
/// most `limit` + one per reading thread. Thread-safe.
class MappedFileSet {
 public:
  struct File {
    std::string path;
    std::size_t size = 0;
    FileStat stat;  ///< as the source opened it (MappedFile::stat())
  };

  MappedFileSet(std::vector<File> files, std::size_t limit);
  ~MappedFileSet();
  MappedFileSet(const MappedFileSet&) = delete;
  MappedFileSet& operator=(const MappedFileSet&) = delete;

  std::size_t size() const { return files_.size(); }
  std::size_t limit() const { return limit_; }
  std::size_t file_size(std::size_t k) const { return files_[k].size; }
  /// The bytes [offset, offset + bytes) of file `k` (within its size: the caller checks).
  /// Valid on this thread until its next read of another file, of this set or another.
  std::span<const std::byte> read(std::size_t k, std::size_t offset, std::size_t bytes) const;
  /// How many mappings the set holds now (not counting those only a thread still holds).
  std::size_t mapped() const;
  /// How many times a read mapped its file (a miss).
  std::uint64_t opens() const;

 private:
  std::shared_ptr<const MappedFile> open(std::size_t k) const;

  std::vector<File> files_;
  std::size_t limit_;
  std::uint64_t id_;  ///< distinguishes sets in the threads' held mapping (never reused)
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const MappedFile>> held_;  ///< per file; null: not mapped
  mutable std::vector<std::uint8_t> used_;   ///< per file: read since the clock's hand passed
  mutable std::vector<std::uint32_t> ring_;  ///< the files held, in the clock's order
  mutable std::size_t hand_ = 0;
  mutable std::uint64_t opens_ = 0;
  /// Mappings found cut short after the set closed them, kept for check_mappings().
  mutable std::vector<std::shared_ptr<const MappedFile>> kept_faulted_;
};

/// A file source's local files as it opens them: all kept mapped for the run, or — when it
/// has more than mapped_files_limit() — those it maps (over 64 KiB) closed once checked and
/// handed to a MappedFileSet of that many mappings.
///
///   LocalMappings local(count_of_local_files);
///   maps_.push_back(local.keep(std::move(m), slot));   // null: read through the set, file `slot`
///   set_ = std::move(local).set();
class LocalMappings {
 public:
  explicit LocalMappings(std::size_t local_files);
  /// Whether the source has more local files than it keeps mapped (keep() then keeps none
  /// that holds a mapping).
  bool bounded() const { return bounded_; }
  /// `m` when the source keeps it mapped; else null, with `slot` set to its file in the set.
  std::shared_ptr<const MappedFile> keep(std::shared_ptr<const MappedFile> m, std::size_t& slot);
  /// The set of the files not kept; null when every file was kept.
  std::unique_ptr<MappedFileSet> set() &&;

 private:
  std::size_t limit_;
  bool bounded_;
  std::vector<MappedFileSet::File> files_;
};

}  // namespace flowstate
