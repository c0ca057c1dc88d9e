// Remote files opened lazily: a source lists its objects when it is built, downloads none
// for its reads' sake, and reads each through a RemoteWindow — a bounded set of cached copies,
// downloaded ahead along the order the source is read and unpinned once the reads moved past
// them, so the cache's LRU eviction frees them mid-epoch and a cache far smaller than the data
// set serves a whole epoch. `records` numbers its records from the listed sizes; `tar` and
// `lines` from the object facts of the job (nodes/sources/remote_listing.h: each object read
// once, through a window, at the job's first build) — and make their index of a copy each
// time the window fetches it (`prepare`), kept with the copy while the window holds it.
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
// One budget per process and cache directory. The windows of a process that read one cache
// (two sources, a mix of them) share its limit: each reserves its look-ahead and one copy
// more when it is built — the reservations of the windows alive together must fit the limit,
// or the build is a ConfigError naming each size — and holds copies beyond its reservation
// only while no other window's reservation needs those bytes: a window that needs room takes
// back what others hold beyond theirs (they unpin their least recently read copies outside
// their look-ahead). So windows of one process never wait for each other's copies. A
// runtime that a Loader's rebuild replaces is not counted against the new one's reservations
// (its windows are gone before the new one reads). Across processes (MPI ranks on one
// machine, other jobs) the reservations are claims in the directory (cache_reservations.h):
// a window's build counts the other processes' claims too, and its downloads leave them free;
// a download that needs bytes another process borrowed and still pins waits for them up to
// the remote timeout, then is a DataError.
//
// A global record shuffle reads files at random: every file is then in use all epoch, and a
// cache that cannot hold the source downloads a file again for most reads of a file it
// unpinned. It works, slowly; such a pipeline wants a limit that holds the source (then nothing
// is unpinned) or range reads (records and indexed: remote_blocks.h).
//
//   auto files = list_source_files({"s3://bucket/train-*.bin"}, {});
//   RemoteWindow window({*files[0].remote, *files[1].remote}, /*lookahead=*/4);
//   const std::byte* bytes = window.data(0);  // valid on this thread until its next data()
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// A file a source's patterns name: a local file as expand_named_paths gives it, or a remote
/// object as listed (nothing downloaded).
struct SourceFile {
  ExpandedPath local;                  ///< a local file; empty for a remote object
  std::optional<RemoteObject> remote;  ///< the listed object, when the file is remote
};

/// How many of `files` are local.
inline std::size_t local_file_count(const std::vector<SourceFile>& files) {
  std::size_t n = 0;
  for (const auto& f : files) n += f.remote ? 0 : 1;
  return n;
}

/// The files `patterns` name, in order, duplicates dropped, downloading nothing: a local
/// pattern through expand_named_paths (relative to `base_dir`), a remote one through
/// job_listing (settings: resolve_remote_settings(`remote`), the source's options over the
/// environment). Throws as those do.
std::vector<SourceFile> list_source_files(const std::vector<std::string>& patterns,
                                          const std::filesystem::path& base_dir = {},
                                          const SourceRemote* remote = nullptr);

struct WindowBudget;
class CacheReservation;  // nodes/sources/cache_reservations.h

/// Remote objects read through the local cache, a bounded window of them at a time (see the
/// file comment). Thread-safe.
class RemoteWindow {
 public:
  /// What a source makes of a copy when the window fetches it — its index of the bytes (a tar's
  /// members, a lines file's offsets) — kept with the copy while the window holds it, made
  /// again when the window fetches the copy again. Called with object `k`'s mapped copy on the
  /// thread that fetched it (a read, or a background download), without the window's lock; an
  /// exception is the error of every read of `k`.
  using Prepare = std::function<std::shared_ptr<const void>(std::size_t k, const MappedFile& copy)>;
  /// A copy held by a caller: the mapping and what `prepare` made of it (null without one).
  struct Copy {
    std::shared_ptr<const MappedFile> map;
    std::shared_ptr<const void> prepared;
  };
  /// What read() returns: the copy's bytes and what `prepare` made of it.
  struct Held {
    const std::byte* data = nullptr;
    const void* prepared = nullptr;
  };

  /// The window over `objects` (in the source's file order), holding `lookahead` files ahead
  /// (at least 1), with the cache and remote settings from the environment. Throws
  /// ConfigError (key FLOWSTATE_CACHE_LIMIT) when the cache limit is below the bytes of the
  /// largest `lookahead` + 1 objects (all of them when there are fewer), or below them and the
  /// reservations of the process's other windows over the same cache directory.
  RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead, Prepare prepare = {});
  /// The same with the cache and remote settings given.
  RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead, CacheSettings cache,
               RemoteSettings remote, Prepare prepare = {});
  /// Stops the background downloads (waits for those in flight) and unpins every copy.
  ~RemoteWindow();
  RemoteWindow(const RemoteWindow&) = delete;
  RemoteWindow& operator=(const RemoteWindow&) = delete;

  /// The bytes of object `k`'s copy, downloading it first when it is not held (a DataError
  /// naming the URL when that fails). Valid on the calling thread until its next call of
  /// data() or read() on any window: the thread holds the mapping until then, so a copy the
  /// window unpins meanwhile stays readable. One relaxed comparison when the thread read `k`
  /// last.
  const std::byte* data(std::size_t k) { return read(k).data; }
  /// data(), with what `prepare` made of the copy (valid as long as the bytes).
  Held read(std::size_t k);
  /// The copy of object `k` (see data()); the caller's pointers hold the mapping.
  Copy open(std::size_t k);

  /// The reads start over (the spine started an epoch): the next read, behind the front, of
  /// a file not held moves the front there (see the file comment).
  void new_pass();
  /// The front goes back to the first file (after a source read every file once to count its
  /// records): the look-ahead is files [0, lookahead) again, downloading from the next read.
  void rewind();
  /// The objects, in order.
  const std::vector<RemoteObject>& objects() const { return objects_; }
  /// Downloads this window asked the cache for (copies it found cached count too).
  std::uint64_t fetches() const;
  /// The bytes this window's look-ahead and one copy more need: its reservation of the limit.
  std::uint64_t reservation() const { return reservation_; }

 private:
  friend struct WindowBudget;
  struct Slot {
    std::shared_ptr<const CachePin> pin;  ///< the cached copy, pinned
    std::shared_ptr<const MappedFile> map;
    std::shared_ptr<const void> prepared;  ///< what prepare_ made of the copy
    std::uint64_t last_read = 0;           ///< the window's clock at the slot's last read
    bool fetching = false;
    std::exception_ptr error;  ///< the background download failed (rethrown to a read)
  };
  bool needed(std::size_t k) const { return k >= front_ && k < front_ + lookahead_; }
  /// Under mu_: counts `bytes` more as held when the process's budget admits them, unpinning
  /// copies outside the look-ahead, least recently read first, as needed; false when it
  /// cannot (copies still downloading, or other windows' reservations, hold the room).
  bool claim(std::uint64_t bytes);
  /// Under mu_: unpins slot `j`, which holds a copy.
  void unpin(std::size_t j);
  /// Under mu_ and the budget's lock: unpins copies outside the look-ahead, least recently
  /// read first, while this window holds more than its reservation (another window needs it).
  void shed_locked();
  /// Under mu_ (held by `lock`): waits until claim() of object `k`'s bytes succeeds (true),
  /// asking the other windows of the process for the bytes they hold beyond their
  /// reservations, or another thread takes or publishes slot `k` (false: nothing claimed); a
  /// DataError naming the object when other windows hold the room past the remote timeout.
  bool claim_waiting(std::size_t k, std::unique_lock<std::mutex>& lock);
  /// Fetches and maps slot `k` (claimed: fetching set, its bytes counted) without holding
  /// mu_, then publishes it; a failure is stored in the slot and rethrown.
  void fetch(std::size_t k, std::unique_lock<std::mutex>& lock);
  void download_ahead();

  std::vector<RemoteObject> objects_;
  std::size_t lookahead_;
  RemoteSettings remote_;
  ObjectCache cache_;
  Prepare prepare_;
  const std::uint64_t id_;  ///< this window among all (the threads' held mapping names it)
  std::uint64_t reservation_ = 0;
  std::shared_ptr<WindowBudget> budget_;  ///< the process's budget of this cache directory
  /// reservation_, seen by the other processes that share the directory.
  std::unique_ptr<CacheReservation> shared_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  ///< a slot was published or failed
  std::condition_variable work_;     ///< the look-ahead moved, or stop
  std::vector<Slot> slots_;
  std::size_t front_ = 0;
  bool started_ = false;   ///< a read happened: the look-ahead downloads
  bool new_pass_ = false;  ///< an epoch started: the next read behind the front moves it
  std::uint64_t clock_ = 0;
  std::uint64_t fetches_ = 0;
  bool stop_ = false;
  std::vector<std::thread> downloaders_;  ///< min(lookahead, connections) threads
};

/// The facts of `remote` (items, sampled blocks, full hash: remote_listing.h's ObjectFacts),
/// once per job (job_object_facts, under `kind`), for a source that reads whole objects through
/// `window`: the objects no rank or memo knows yet are read once, in order — the window
/// downloads ahead meanwhile — their items counted by `items` from what the window's `prepare`
/// made of the copy, and let go; the window is rewound after.
std::vector<ObjectFacts> window_object_facts(
    const std::string& kind, const std::vector<RemoteObject>& remote, RemoteWindow& window,
    const std::function<std::uint64_t(const void*)>& items);

/// An object's item count not known yet (open_remote_files).
inline constexpr std::uint64_t kItemsUnknown = ~std::uint64_t{0};

/// What a source that reads whole remote files through a window (lines, tar) sets up when it
/// opens, for the remote ones among `files` (none: nothing is made and no facts returned).
/// `expected` gets each object's item count, kItemsUnknown (which `prepare` may read) while
/// window_object_facts under `kind` counts the ones no rank or memo knows yet (`items`), then
/// the facts'; `window` reads them, `lookahead` ahead, with `settings`' cache and remote
/// options. Returns the facts, one per remote file in order.
std::vector<ObjectFacts> open_remote_files(const std::vector<SourceFile>& files,
                                           const SourceRemote& settings, std::size_t lookahead,
                                           RemoteWindow::Prepare prepare, const std::string& kind,
                                           const std::function<std::uint64_t(const void*)>& items,
                                           std::unique_ptr<RemoteWindow>& window,
                                           std::vector<std::atomic<std::uint64_t>>& expected);

}  // namespace flowstate
