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

/// A run's hold on a checkpoint directory: an exclusive POSIX record lock (fcntl F_SETLK) on
/// the file `path`, created if needed and never removed, taken without waiting and held until
/// destruction. The kernel releases it when the process dies (a SIGKILL never leaves it held).
/// While it is held, another process's RunLock on the same file throws CheckpointError naming
/// the holder's pid (F_GETLK). Per process: a second RunLock of the same process on the same
/// file does not exclude the first, and closing the file elsewhere in the process would
/// release it (nothing else opens it). The file also holds the holder's pid, for people.
class RunLock {
 public:
  /// Throws CheckpointError on `path` when another process holds it ("in use by pid N"), or
  /// when the file cannot be created or locked. `what` names the thing held in the message
  /// ("checkpoint directory 'ck'").
  RunLock(const std::string& path, const std::string& what);
  ~RunLock();
  RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace flowstate
