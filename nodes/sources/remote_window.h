// Remote files opened lazily: a source whose records are numbered from the listing alone
// (`records`: an object's size says its count) lists its objects when it is built, downloads
// none, and reads each through a RemoteWindow — a bounded set of cached copies, downloaded
// ahead along the order the source is read and unpinned once the reads moved past them, so
// the cache's LRU eviction frees them mid-epoch and a cache far smaller than the data set
// serves a whole epoch.
//
// The order. Reads tell the window where the source is: the file a read asks for is the
// window's front when it is at or past the front (reading in order, a buffer shuffle's
// current files, a resume that starts mid-epoch), or — after the source's spine started an
// epoch (new_pass) — the first read behind the front of a file not held (the epoch starting
// over); otherwise it is a straggler (a record a shuffle buffer kept long), served from the
// copy held, or downloaded again (a shard per straggler whose file was unpinned). The files
// [front, front + lookahead) are the look-ahead: downloaded in the background in file order,
// `connections` at a time, from the first read on, and never unpinned. A copy outside the
// look-ahead stays pinned while the cache limit has room and is unpinned — least recently
// read first — when a download needs its bytes; unpinned, the cache may evict it.
//
// The limit must hold the look-ahead and one copy more (a straggler, or the file read while
// the look-ahead moves on): a smaller limit is a ConfigError when the source is built, naming
// both sizes — never a wait for space that cannot come.
//
// A global record shuffle reads files at random: every file is then in use all epoch, and a
// cache that cannot hold the source downloads a file again for most reads of a file it
// unpinned. It works, slowly; such a pipeline wants a limit that holds the source (then nothing
// is unpinned) or range reads (not built).
//
//   auto files = list_source_files({"s3://bucket/train-*.bin"}, {});
//   RemoteWindow window({*files[0].remote, *files[1].remote}, /*lookahead=*/4);
//   const std::byte* bytes = window.data(0);  // valid on this thread until its next data()
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// A file a source's patterns name: a local file as expand_named_paths gives it, or a remote
/// object as listed (nothing downloaded).
struct SourceFile {
  ExpandedPath local;                  ///< a local file; empty for a remote object
  std::optional<RemoteObject> remote;  ///< the listed object, when the file is remote
};

/// The files `patterns` name, in order, duplicates dropped, downloading nothing: a local
/// pattern through expand_named_paths (relative to `base_dir`), a remote one through
/// list_remote (RemoteSettings::from_environment()). Throws as those do.
std::vector<SourceFile> list_source_files(const std::vector<std::string>& patterns,
                                          const std::filesystem::path& base_dir = {});

/// The default of a source's `lookahead` option: files downloaded ahead of the reads.
inline constexpr std::size_t kDefaultLookahead = 8;
/// The doc of a source's `lookahead` option.
inline constexpr const char* kLookaheadDoc =
    "remote files (s3://, http(s)://) held ahead of the reads, downloading in the background "
    "(blocks, when the source reads them by range); the cache limit must hold this many files "
    "(blocks) and one more";

/// Remote objects read through the local cache, a bounded window of them at a time (see the
/// file comment). Thread-safe.
class RemoteWindow {
 public:
  /// The window over `objects` (in the source's file order), holding `lookahead` files ahead
  /// (at least 1), with the cache and remote settings from the environment. Throws
  /// ConfigError (key FLOWSTATE_CACHE_LIMIT) when the cache limit is below the bytes of the
  /// largest `lookahead` + 1 objects (all of them when there are fewer).
  RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead);
  /// The same with the cache and remote settings given.
  RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead, CacheSettings cache,
               RemoteSettings remote);
  /// Stops the background downloads (waits for those in flight) and unpins every copy.
  ~RemoteWindow();
  RemoteWindow(const RemoteWindow&) = delete;
  RemoteWindow& operator=(const RemoteWindow&) = delete;

  /// The bytes of object `k`'s copy, downloading it first when it is not held (a DataError
  /// naming the URL when that fails). Valid on the calling thread until its next call of
  /// data() on any window: the thread holds the mapping until then, so a copy the window
  /// unpins meanwhile stays readable. One relaxed comparison when the thread read `k` last.
  const std::byte* data(std::size_t k);
  /// The mapped copy of object `k` (see data()); the caller's pointer holds the mapping.
  std::shared_ptr<const MappedFile> open(std::size_t k);

  /// The reads start over (the spine started an epoch): the next read, behind the front, of
  /// a file not held moves the front there (see the file comment).
  void new_pass();
  /// The objects, in order.
  const std::vector<RemoteObject>& objects() const { return objects_; }
  /// Downloads this window asked the cache for (copies it found cached count too).
  std::uint64_t fetches() const;

 private:
  struct Slot {
    std::shared_ptr<const CachePin> pin;  ///< the cached copy, pinned
    std::shared_ptr<const MappedFile> map;
    std::uint64_t last_read = 0;  ///< the window's clock at the slot's last read
    bool fetching = false;
    std::exception_ptr error;  ///< the background download failed (rethrown to a read)
  };
  bool needed(std::size_t k) const { return k >= front_ && k < front_ + lookahead_; }
  /// Under mu_: unpins copies outside the look-ahead, least recently read first, until
  /// `bytes` more fit the limit; false when they do not (copies still downloading hold room).
  bool make_room(std::size_t bytes);
  /// Fetches and maps slot `k` (claimed: fetching set, its bytes counted) without holding
  /// mu_, then publishes it; a failure is stored in the slot and rethrown.
  void fetch(std::size_t k, std::unique_lock<std::mutex>& lock);
  void download_ahead();

  std::vector<RemoteObject> objects_;
  std::size_t lookahead_;
  RemoteSettings remote_;
  ObjectCache cache_;
  const std::uint64_t id_;  ///< this window among all (the threads' held mapping names it)

  mutable std::mutex mu_;
  std::condition_variable changed_;  ///< a slot was published or failed
  std::condition_variable work_;     ///< the look-ahead moved, or stop
  std::vector<Slot> slots_;
  std::size_t front_ = 0;
  bool started_ = false;   ///< a read happened: the look-ahead downloads
  bool new_pass_ = false;  ///< an epoch started: the next read behind the front moves it
  std::uint64_t clock_ = 0;
  std::uint64_t held_bytes_ = 0;  ///< bytes of slots pinned or downloading
  std::uint64_t fetches_ = 0;
  bool stop_ = false;
  std::vector<std::thread> downloaders_;  ///< min(lookahead, connections) threads
};

}  // namespace flowstate
