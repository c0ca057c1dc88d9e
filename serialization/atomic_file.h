// Durable file-system steps for checkpoints (POSIX). A checkpoint is only as safe as the order
// in which its bytes reach the disk: a file is fsynced before it is renamed into place, and a
// directory is fsynced after an entry in it is created, renamed or removed, so that after a
// crash — of the process or of the machine — every name points at complete contents.
//
//   write_file_durably(dir + "/state.bin.tmp", bytes);   // on disk when it returns
//   rename_path(dir + "/state.bin.tmp", dir + "/state.bin");
//   fsync_directory(dir);                                 // the rename is on disk too
//
// Every failure is a CheckpointError naming the path and the system's reason.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace flowstate {

/// Creates `path` (which must not exist), writes `data`, fsyncs and closes it. On failure
/// the partial file is removed (best effort) and CheckpointError names `path`.
void write_file_durably(const std::string& path, std::string_view data);

/// The same without the fsync.
void write_file(const std::string& path, std::string_view data);

/// Fsyncs the directory `dir`, making the creation, renaming and removal of its entries
/// durable. Throws CheckpointError.
void fsync_directory(const std::string& dir);

/// How replace_file_atomically treats the disk.
enum class Durability {
  kDurable,  ///< fsyncs the file before the rename and the parent after it
  kHint,     ///< no fsync: atomic for readers and across a process crash, but after a power
             ///< loss the file may be stale or empty
};

/// Replaces the contents of file `path` atomically: a reader (or a restart after a process
/// crash) sees the old contents or the new ones, never a mix. Writes `path`.tmp, (fsyncs it,)
/// renames it over `path` (and fsyncs the parent). Not safe against concurrent writers of
/// `path`.
void replace_file_atomically(const std::string& path, std::string_view data,
                             Durability durability = Durability::kDurable);

/// Renames `from` to `to` (rename(2): replaces a file, or an empty directory). Does not fsync.
/// Throws CheckpointError naming both.
void rename_path(const std::string& from, const std::string& to);

/// Creates directory `path` and any missing parents, fsyncing the parent of each directory
/// it creates. An existing directory is not an error. Throws CheckpointError.
void create_directories_durably(const std::string& path);

/// Removes `path` and everything under it; a missing path is not an error. Does not fsync
/// the parent. Throws CheckpointError.
void remove_tree(const std::string& path);

/// The whole contents of file `path`; throws CheckpointError when it cannot be read or holds
/// more than `max_bytes`.
std::string read_small_file(const std::string& path, std::size_t max_bytes);

/// An exclusive advisory lock (flock(2)) on the file `path`, created if needed and never
/// removed. Blocks until the lock is free. Held until destruction; the kernel also releases
/// it when the process dies, so a killed writer never leaves a directory locked. Excludes
/// other processes and other DirectoryLock objects of this process alike.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& path);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace flowstate
