// The local cache of remote objects: whole copies of `s3://` and `http(s)://` objects in one
// directory, bounded in bytes, shared by the processes of one machine and surviving restarts.
//
// Layout of the directory:
//
//   lock                          flock'ed around every look-up, reservation, eviction, commit
//   objects/<32 hex>.obj          a whole, verified copy; the name hashes the URL, ETag and size
//                                 (or a block of one: bytes [a, b) of it, the range hashed too)
//   objects/<32 hex>.obj.fsidx    a source's index of that copy (tar, lines), evicted with it
//   partial/<32 hex>.<pid>.<n>.part  a download in progress, sized to the object's bytes
//   reservations/PID, PID_*       what each process's sources reserve of the limit: empty
//                                 files (nodes/sources/cache_reservations.h)
//
// A download writes a partial file (created at the object's size, so the directory's bytes
// count it whole from the start), fsyncs it, and renames it into objects/ under the lock: a
// SIGKILL at any moment leaves a partial file — removed by the next process that reserves
// space, its writer being dead — never an `.obj` that is not whole. A copy is whole when its
// bytes arrived in full, the server's answers carried the listed ETag (If-Match), and its size
// is the listed size; a look-up checks the size again.
//
// Pins: a copy a source reads is held open with a shared flock. Eviction — least recently used
// first (a look-up touches the copy's mtime) — takes an exclusive flock without waiting and
// skips a copy it cannot lock, so no process's pinned copy is ever deleted. Eviction deletes
// only `objects/*.obj` (and their `.fsidx`) and dead writers' `partial/*.part` files; any other
// file in the directory is left alone and not counted.
//
//   ObjectCache cache(CacheSettings::from_environment());
//   auto pins = cache.fetch(list_remote("s3://bucket/train-*.tar", remote), remote);
//   MappedFile f(pins[0]->path());
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

struct SourceRemote;  // nodes/sources/remote_options.h

/// Where the cache lies and how large it may grow.
struct CacheSettings {
  /// FLOWSTATE_CACHE_DIR; default $XDG_CACHE_HOME/flowstate, else ~/.cache/flowstate.
  std::filesystem::path dir;
  /// FLOWSTATE_CACHE_LIMIT ("20GiB", "500MB", "1048576"); default 20 GiB.
  std::uint64_t limit = std::uint64_t{20} << 30;
  /// Where `limit` was set, for the key of a "limit too small" ConfigError and its advice:
  /// "FLOWSTATE_CACHE_LIMIT", a source's "records.cache.limit", the job's "cache_limit".
  std::string limit_key = "FLOWSTATE_CACHE_LIMIT";

  /// Reads the environment. Throws ConfigError (key FLOWSTATE_CACHE_LIMIT) for a bad size.
  static CacheSettings from_environment();
  /// FLOWSTATE_CACHE_DIR; else $XDG_CACHE_HOME/flowstate, ~/.cache/flowstate, or
  /// /tmp/flowstate-cache-UID without a home.
  static std::filesystem::path environment_dir();
  /// FLOWSTATE_CACHE_LIMIT, else 20 GiB. Throws ConfigError (key FLOWSTATE_CACHE_LIMIT) for a
  /// bad size or 0.
  static std::uint64_t environment_limit();
};

/// Parses a byte size: digits, then optionally B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
/// GiB, TiB (powers of 1024), a space allowed before the unit. Throws ConfigError under `key`.
std::uint64_t parse_byte_size(const std::string& text, const std::string& key);

/// The cache's lock (DIR/lock), held for a scope. Each holder opens the lock file itself: flock
/// excludes open file descriptions, so threads of one process exclude each other too. Throws
/// DataError naming the file when it cannot be opened.
class CacheLock {
 public:
  explicit CacheLock(const std::filesystem::path& path);
  ~CacheLock();
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

/// A cached copy held open for reading: it is not evicted while a Pin of it lives.
class CachePin {
 public:
  CachePin(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~CachePin();
  CachePin(const CachePin&) = delete;
  CachePin& operator=(const CachePin&) = delete;
  /// The copy's path (objects/<key>.obj).
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_;
};

/// The cache in one directory (created if missing). Thread-safe; shared by processes.
class ObjectCache {
 public:
  /// Opens (creates) the cache. Throws DataError naming the directory when it cannot.
  explicit ObjectCache(CacheSettings settings);

  /// Pins a whole copy of each object, in order, downloading those not cached —
  /// `remote.connections` at a time, each reserving its bytes first (evicting what no one
  /// pins). The objects are pinned together, so their bytes must fit the limit: more is a
  /// ConfigError (key FLOWSTATE_CACHE_LIMIT) naming both sizes, raised before any download.
  /// A download that fails is a DataError (see download_object); its partial file is removed.
  /// Space held by other processes' pins is waited for (up to the remote timeout, then a
  /// DataError).
  std::vector<std::shared_ptr<const CachePin>> fetch(const std::vector<RemoteObject>& objects,
                                                     const RemoteSettings& remote);

  /// Pins a copy of bytes [offset, offset + length) of `object` — a block of a range reader
  /// (nodes/sources/remote_blocks.h) — downloading it when not cached (one ranged GET with
  /// If-Match, retried, resuming within the range) under the same rules as a whole object:
  /// reserved before the download, fsynced and renamed under the lock, pinned, evicted least
  /// recently used when no one pins it. Its key is block_key(). A range longer than the limit
  /// is a ConfigError; a failed download a DataError naming the URL and the byte range.
  std::shared_ptr<const CachePin> fetch_range(const RemoteObject& object, std::uint64_t offset,
                                              std::uint64_t length, const RemoteSettings& remote);

  /// Bytes [offset, offset + length) of `object`, as fetch_range and pin_cached name a block.
  struct Range {
    const RemoteObject* object = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
  };
  /// Pins the copies of those of `ranges` the cache holds whole, all under one hold of the
  /// lock (fetch_range takes it once per block): per range its pin, or null when it is not
  /// cached (fetch_range downloads it). A warm reader asks for all its blocks at once.
  std::vector<std::shared_ptr<const CachePin>> pin_cached(const std::vector<Range>& ranges);

  /// Bytes the cache's files take now (copies, their indexes, partial downloads).
  std::uint64_t usage() const;
  const CacheSettings& settings() const { return settings_; }

 private:
  std::shared_ptr<const CachePin> lookup(const RemoteObject& object);
  /// Under the lock: the copy named `key` when it is whole (`size` bytes), pinned and touched.
  std::shared_ptr<const CachePin> lookup(const std::string& key, std::uint64_t size);
  std::shared_ptr<const CachePin> download(const RemoteObject& object,
                                           const RemoteSettings& remote);
  /// Downloads bytes [offset, offset + length) of `object` into the copy named `key`.
  std::shared_ptr<const CachePin> download(const std::string& key, const RemoteObject& object,
                                           std::uint64_t offset, std::uint64_t length,
                                           const RemoteSettings& remote);
  /// Under the lock: evicts until `bytes` more fit; false when pins prevent it.
  bool make_room(std::uint64_t bytes);

  CacheSettings settings_;
  std::filesystem::path objects_, partial_, lock_path_;
};

/// The objects a remote `pattern` names (job_listing: listed once per job), fetched into the
/// cache and pinned: per object its copy's path,
/// its URL as the name (so a data identity names the object, wherever the cache lies), and the
/// pin in `keep`, and its ETag. expand_named_paths calls it for an `s3://`, `http://` or `https://`
/// pattern.
/// `source`, when given, is the source's cache and remote options (resolve_cache_settings,
/// resolve_remote_settings; nodes/sources/remote_options.h); null: the job's and environment's.
std::vector<ExpandedPath> expand_remote_paths(const std::string& pattern,
                                              const SourceRemote* source = nullptr);

/// "N bytes", with MiB or GiB beside it from 1 MiB on: how the cache's messages (and the
/// look-ahead window's) write a size.
std::string bytes_text(std::uint64_t b);

/// The cache key of an object: 32 hex digits from its URL, ETag and size.
std::string cache_key(const RemoteObject& object);
/// The cache key of bytes [offset, offset + length) of an object (a block): 32 hex digits from
/// its URL, ETag, size and the range — never a whole copy's key.
std::string block_key(const RemoteObject& object, std::uint64_t offset, std::uint64_t length);

}  // namespace flowstate
