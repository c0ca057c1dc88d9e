// Remote objects read by range: fixed, aligned blocks of each object (the last one short), each
// block a copy of its own in the local cache (ObjectCache::fetch_range: keyed by URL, ETag, size
// and range; reserved, fsynced and renamed under the cache's lock, pinned while held, evicted
// least recently used when no one pins it). What random-access formats read when the cache
// cannot hold their objects whole: an `indexed` source's PREFIX.bin, and a `records` source
// whose objects are larger together than the cache limit (records.h says when).
//
// The order. A read of block g moves the front to g when g lies at or past it: within
// `lookahead` blocks of the front (the reads progress: in order, a buffer shuffle, pack's
// documents) the look-ahead is the blocks [g, g + lookahead), those after g downloaded in the
// background in block order, `connections` at a time, and never unpinned; farther (a jump: a global
// shuffle's reads) the front moves without a look-ahead, so random reads download only what they
// read. A read behind the front is a straggler; after new_pass() (the spine started an epoch) the
// next read sets the front wherever it is. Blocks outside the look-ahead stay pinned while the
// limit has room and are unpinned least recently read first when a download needs their bytes.
//
// When the limit (less `reserved`) holds every block, the reader holds them all: the first
// read pins and maps every block the cache already holds, under one hold of the cache's lock
// (ObjectCache::pin_cached), and from then on the others are downloaded in the background,
// `connections` at a time, the blocks near the front first; none is ever unpinned. A warm
// cache is then read at the speed of mapped files, without a lock per read (their pages
// mapped in by the downloaders once nothing is left to download, as a local .bin's are by a
// thread of its own: a read never waits for that), and view() gives spans that stay valid as
// long as the reader lives (a range across blocks copied once, and kept).
//
// Reads planned from the order (plan()). The spine knows the reads before they happen: it hands
// the source the Refs of every batch it plans, and the source hands them here as byte ranges, in
// step order. The blocks those reads touch are then downloaded in the plan's order,
// `connections` at a time, as far ahead as the limit allows less the look-ahead's least
// (lookahead + 1 blocks: the blocks just read, read again soon, and the block a read that finds
// its own neither held nor in flight downloads), at least `lookahead` blocks: the plan's pins — a
// block pinned for the plan stays until every planned read of it has read it — whatever the reads'
// order, a global shuffle's random reads included. While a plan is given the read-following
// look-ahead above is off (the plan replaces it), and the plan's pins give way to a read that
// needs room (its own download unpins the one planned last), so the least limit stays the
// look-ahead's, lookahead + 1 blocks, and no read waits on a pin no read will release. A plan
// names reads, it never changes one: the bytes read are the same with it or without it
// (FLOWSTATE_REMOTE_PLAN=1 turns it on; off by default), and it is never state — a resumed spine
// plans from its restored position. stats() counts how the reads found their blocks.
//
// The limit must hold the look-ahead and one block more (a straggler, read behind the front):
// lookahead + 1 of the largest blocks (fewer when the objects have fewer), beside `reserved` bytes
// the source pins otherwise (an indexed source's .idx copies); less is a ConfigError when the
// source is built.
//
// A read returns a span valid on the calling thread until its next read through any
// RemoteBlocks: within one block it points into the block's mapping (the thread holds it, so a
// block unpinned meanwhile stays readable); a range across blocks (a document across a block
// boundary) is copied, block after block, into a buffer of the thread's — one block pinned at
// a time.
//
//   RemoteBlocks blocks({bin}, /*lookahead=*/8, /*block_bytes=*/4 << 20, cache, remote);
//   std::span<const std::byte> doc = blocks.read(0, offset, length);
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// The default block of a range read: 4 MiB.
inline constexpr std::uint64_t kDefaultBlockBytes = std::uint64_t{4} << 20;
/// The smallest block FLOWSTATE_REMOTE_BLOCK may ask for.
inline constexpr std::uint64_t kMinBlockBytes = 4096;

/// FLOWSTATE_REMOTE_BLOCK (a byte size: "4MiB", "65536"), else kDefaultBlockBytes. Throws
/// ConfigError (key FLOWSTATE_REMOTE_BLOCK) for a bad size or one below kMinBlockBytes.
std::uint64_t block_bytes_from_environment();

/// The blocks of an object of `size` bytes read in blocks of `block` bytes: ceil(size / block).
std::uint64_t block_count(std::uint64_t size, std::uint64_t block);

/// Bytes [offset, offset + length) of an object.
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  bool operator==(const ByteRange&) const = default;
};
/// Block `k` of an object of `size` bytes: [k * block, min(size, (k + 1) * block)). Requires
/// k < block_count(size, block).
ByteRange block_range(std::uint64_t size, std::uint64_t block, std::uint64_t k);

/// The blocks [first, last] that bytes [offset, offset + length) touch (length > 0).
struct BlockSpan {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  bool operator==(const BlockSpan&) const = default;
};
/// The blocks of `block` bytes that bytes [offset, offset + length) touch; length must be > 0.
BlockSpan blocks_spanned(std::uint64_t offset, std::uint64_t length, std::uint64_t block);

/// The bytes the cache must hold for `lookahead` blocks ahead of a read and the block read,
/// over objects of `sizes` read in blocks of `block`: lookahead + 1 of the largest blocks (all
/// of them when there are fewer).
std::uint64_t blocks_needed(const std::vector<std::uint64_t>& sizes, std::uint64_t block,
                            std::size_t lookahead);

/// One read the spine planned: bytes [offset, offset + length) of object `object`.
struct PlannedRead {
  std::size_t object = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

/// How a RemoteBlocks' reads found their blocks. A read is counted each time it opens a block
/// (a thread's reads one after another within one block count once), except the lock-free reads
/// of a reader that holds every block.
struct BlockReadStats {
  std::uint64_t held = 0;             ///< found the block downloaded
  std::uint64_t in_flight = 0;        ///< waited for a download another thread had started
  std::uint64_t on_demand = 0;        ///< downloaded the block itself: the read stalled for a GET
  std::uint64_t fetches = 0;          ///< blocks asked of the cache (blocks found cached count too)
  std::uint64_t planned_fetches = 0;  ///< of them, taken from the plan by the downloaders
  std::uint64_t planned_reads = 0;    ///< reads plan() was given
};

/// FLOWSTATE_REMOTE_PLAN: "1" turns reads planned from the order on; unset or "0": off
/// (RemoteBlocks::plan does nothing). Throws ConfigError (key FLOWSTATE_REMOTE_PLAN) for anything
/// else.
bool remote_plan_from_environment();

/// Remote objects read by range through the local cache (see the file comment). Thread-safe.
class CacheReservation;  // nodes/sources/cache_reservations.h

class RemoteBlocks {
 public:
  /// Reads `objects` (in the source's file order) in blocks of `block_bytes`, holding
  /// `lookahead` blocks ahead of sequential reads (at least 1). `reserved`: bytes of the
  /// cache the source pins otherwise. Throws ConfigError (key FLOWSTATE_CACHE_LIMIT) when the
  /// limit less `reserved` is below blocks_needed(), naming both and the lookahead.
  RemoteBlocks(std::vector<RemoteObject> objects, std::size_t lookahead, std::uint64_t block_bytes,
               CacheSettings cache, RemoteSettings remote, std::uint64_t reserved = 0);
  /// Stops the background downloads (waits for those in flight) and unpins every block.
  ~RemoteBlocks();
  RemoteBlocks(const RemoteBlocks&) = delete;
  RemoteBlocks& operator=(const RemoteBlocks&) = delete;

  /// Bytes [offset, offset + length) of object `object`, downloading the blocks not held (a
  /// DataError naming the URL and range when that fails; one for a range past the object's
  /// listed size). Valid on the calling thread until its next read() on any RemoteBlocks.
  std::span<const std::byte> read(std::size_t object, std::uint64_t offset,
                                  std::size_t length) const;

  /// Whether the reader holds every block (the limit holds them all; see the file comment).
  bool holds_all() const { return hold_all_; }
  /// With holds_all(): bytes [offset, offset + length) of object `object`, as read() gives
  /// them, valid as long as the reader lives (a range across blocks is copied once and kept).
  std::span<const std::byte> view(std::size_t object, std::uint64_t offset,
                                  std::size_t length) const;

  /// The reads start over (the spine started an epoch): the next read sets the front.
  void new_pass();
  /// Whether plan() does anything: FLOWSTATE_REMOTE_PLAN is 1 and the reader does not hold
  /// every block (then nothing needs planning). A source asks once, when it is built.
  bool plans() const { return plan_on_ && !hold_all_; }
  /// The next reads, in the order they will come (the spine's planned batches): their blocks are
  /// downloaded in that order ahead of the reads (see the file comment). Reads named and never
  /// read (a run that stops) hold at most the plan's bytes, which give way to reads.
  void plan(std::span<const PlannedRead> reads) const;
  /// How the reads found their blocks so far.
  BlockReadStats stats() const;
  /// The objects, in order.
  const std::vector<RemoteObject>& objects() const { return objects_; }
  std::uint64_t block_bytes() const { return block_; }
  /// Blocks this reader asked the cache for (blocks it found cached count too).
  std::uint64_t fetches() const;

 private:
  struct Slot {
    std::shared_ptr<const CachePin> pin;  ///< the block's copy, pinned
    std::shared_ptr<const MappedFile> map;
    std::uint64_t last_read = 0;  ///< the reader's clock at the block's last read
    bool fetching = false;
    std::exception_ptr error;   ///< the download failed (rethrown to a read)
    std::uint32_t planned = 0;  ///< planned reads of the block not read yet
    bool plan_pin = false;      ///< held (or downloading) for the plan: counted in plan_bytes_
  };
  /// Block `g` (numbered across the objects) as a range of its object.
  std::size_t object_of(std::uint64_t g) const;
  ByteRange range_of(std::uint64_t g) const;
  /// The look-ahead: [front, front + lookahead) while the reads progress, else the front.
  bool needed(std::uint64_t g) const {
    return hold_all_ || (started_ && g >= front_ && g < front_ + (sequential_ ? lookahead_ : 1));
  }
  /// With hold_all_: block `g`'s mapping, downloading it first when it is not published yet.
  const MappedFile& held(std::uint64_t g) const;
  /// Checks a range of object `object` and returns the blocks it spans.
  BlockSpan span_of(std::size_t object, std::uint64_t offset, std::size_t length) const;
  /// The mapped copy of block `g`, held in a slot (downloaded first when not held).
  std::shared_ptr<const MappedFile> open(std::uint64_t g) const;
  /// Under mu_: unpins blocks outside the look-ahead, least recently read first, until `bytes`
  /// more fit; false when they do not (blocks still downloading hold room). For a read
  /// (`for_read`), blocks pinned for the plan give way too, after the others.
  bool make_room(std::uint64_t bytes, bool for_read = false) const;
  /// Under mu_: a read of block `g` (whose map the reader now holds) was planned: counts it read,
  /// and drops the block's plan pin after its last planned read.
  void consume_planned(std::uint64_t g) const;
  /// Under mu_: the plan's next block to download (claimed: fetching, its bytes counted), pinning
  /// for the plan the blocks before it that are held or downloading; kNone when the plan's bytes
  /// are spent or nothing is left to download.
  std::uint64_t claim_planned() const;
  /// Under mu_: block `g` no longer held for the plan.
  void drop_plan_pin(std::uint64_t g, Slot& s) const;
  /// Appends this reader's stats as a JSON line to FLOWSTATE_REMOTE_STATS, when set.
  void write_stats() const;
  /// Downloads and maps the claimed block `g` without holding mu_, then publishes it.
  void fetch(std::uint64_t g, std::unique_lock<std::mutex>& lock) const;
  /// With hold_all_, once (the first read; other reads wait for it): pins and maps every block
  /// the cache holds, without holding mu_, and publishes them.
  void adopt_cached(std::unique_lock<std::mutex>& lock) const;
  void download_ahead();

  std::vector<RemoteObject> objects_;
  std::vector<std::uint64_t> first_;  ///< each object's first block, plus the total
  std::uint64_t block_;
  std::uint64_t lookahead_;
  std::uint64_t budget_;  ///< the cache limit less `reserved`
  /// What this reader reserves of the directory (every block, or its look-ahead's, and
  /// `reserved`), seen by the other processes that share it.
  std::unique_ptr<CacheReservation> shared_;
  std::string share_;  ///< the share of this reader's blocks (objects_share)
  RemoteSettings remote_;
  mutable ObjectCache cache_;
  const std::uint64_t id_;  ///< this reader among all (the threads' held mapping names it)
  bool hold_all_ = false;   ///< every block fits: all are downloaded and none unpinned
  bool populate_ = false;   ///< hold_all_, and at most a quarter of the memory: map pages in
  /// With hold_all_: each block's mapping once published (its slot keeps it for good).
  std::unique_ptr<std::atomic<const MappedFile*>[]> published_;
  mutable std::mutex kept_mu_;
  /// With hold_all_: ranges across blocks, copied once, by object and offset.
  mutable std::unordered_map<std::uint64_t,
                             std::unordered_map<std::uint64_t, std::vector<std::byte>>>
      kept_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;                ///< a block was published or failed
  mutable std::condition_variable work_;                   ///< the look-ahead moved, or stop
  mutable std::unordered_map<std::uint64_t, Slot> slots_;  ///< blocks held or downloading
  mutable std::uint64_t front_ = 0;
  mutable bool started_ = false;     ///< a read set the front
  mutable bool sequential_ = false;  ///< the reads progress: the look-ahead downloads
  mutable bool new_pass_ = false;
  mutable std::uint64_t clock_ = 0;
  mutable std::uint64_t held_bytes_ = 0;  ///< bytes of blocks pinned or downloading
  mutable std::uint64_t fetches_ = 0;
  mutable bool adopting_ = false;  ///< adopt_cached runs
  mutable bool adopted_ = false;   ///< adopt_cached ran
  /// With populate_: blocks published whose pages the downloaders have not mapped in yet.
  mutable std::vector<std::uint64_t> unpopulated_;
  mutable BlockReadStats stats_;  ///< (its `fetches` is fetches_)
  bool plan_on_ = false;          ///< FLOWSTATE_REMOTE_PLAN=1
  /// A plan was given: reads consume it, and the read-following look-ahead is off.
  mutable std::atomic<bool> planning_{false};
  mutable std::deque<std::uint64_t> plan_;  ///< planned blocks in order (runs of one merged)
  mutable std::uint64_t plan_bytes_ = 0;    ///< bytes of the blocks pinned for the plan
  std::uint64_t plan_budget_ = 0;  ///< the limit less lookahead + 1 blocks, at least lookahead
  bool stop_ = false;
  std::vector<std::thread> downloaders_;  ///< min(lookahead, connections) threads
};

}  // namespace flowstate
