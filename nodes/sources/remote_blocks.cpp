// RemoteBlocks in one file (over 600 lines): the look-ahead, the plan, the hold-all mode and
// the downloaders share one mutex and one slot table (remote_blocks.h); split, each part would
// need that lock's invariants spelled out again.
#include "flowstate/nodes/sources/remote_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/cache_reservations.h"

namespace flowstate {

namespace {

std::atomic<std::uint64_t> g_reader_ids{1};

/// The block mapping a thread read last, and whose, and the thread's buffer for ranges across
/// blocks: both live until the thread's next read, so a span read() returned stays valid
/// however the reader moves meanwhile.
struct HeldBlock {
  std::uint64_t reader = 0;
  std::uint64_t g = 0;
  std::shared_ptr<const MappedFile> map;
  std::vector<std::byte> buffer;
};
thread_local HeldBlock t_held;

constexpr std::uint64_t kNone = ~std::uint64_t{0};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

/// Whether `bytes` are at most a quarter of the machine's memory (as IndexedSource populates).
bool fits_a_quarter_of_memory(std::uint64_t bytes) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 &&
         bytes <= static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 4;
}

}  // namespace

std::uint64_t block_bytes_from_environment() {
  const char* v = std::getenv("FLOWSTATE_REMOTE_BLOCK");
  if (v == nullptr || *v == '\0') return kDefaultBlockBytes;
  const std::uint64_t b = parse_byte_size(v, "FLOWSTATE_REMOTE_BLOCK");
  if (b < kMinBlockBytes)
    throw ConfigError("FLOWSTATE_REMOTE_BLOCK", "'" + std::string(v) + "' is below the " +
                                                    std::to_string(kMinBlockBytes) +
                                                    "-byte smallest block");
  return b;
}

bool remote_plan_from_environment() {
  const char* v = std::getenv("FLOWSTATE_REMOTE_PLAN");
  // Off unless asked for: behind a link shared by the connections, a plan over a cache smaller
  // than the data downloads blocks that a read's room evicts before their planned read, and
  // loses more bandwidth than it saves stalls (bench/RESULTS.md, "reads planned from the
  // order, behind a shared link").
  if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return false;
  if (std::string_view(v) == "1") return true;
  throw ConfigError("FLOWSTATE_REMOTE_PLAN",
                    "'" + std::string(v) + "' is not 0 (reads not planned) or 1 (planned)");
}

std::uint64_t block_count(std::uint64_t size, std::uint64_t block) {
  return size / block + (size % block != 0 ? 1 : 0);
}

ByteRange block_range(std::uint64_t size, std::uint64_t block, std::uint64_t k) {
  const std::uint64_t offset = k * block;
  return {offset, std::min(block, size - offset)};
}

BlockSpan blocks_spanned(std::uint64_t offset, std::uint64_t length, std::uint64_t block) {
  return {offset / block, (offset + length - 1) / block};
}

std::uint64_t blocks_needed(const std::vector<std::uint64_t>& sizes, std::uint64_t block,
                            std::size_t lookahead) {
  // The largest blocks: each object's first one (min(block, size)) is its largest, and an
  // object of n blocks has n - 1 of full size.
  std::vector<std::uint64_t> largest;
  const std::size_t want = lookahead + 1;
  for (const std::uint64_t size : sizes) {
    const std::uint64_t n = block_count(size, block);
    for (std::uint64_t k = 0; k < n && k < want; ++k)
      largest.push_back(block_range(size, block, k).length);
  }
  const std::size_t held = std::min(largest.size(), want);
  std::partial_sort(largest.begin(), largest.begin() + static_cast<std::ptrdiff_t>(held),
                    largest.end(), std::greater<>());
  std::uint64_t need = 0;
  for (std::size_t i = 0; i < held; ++i) need += largest[i];
  return need;
}

RemoteBlocks::RemoteBlocks(std::vector<RemoteObject> objects, std::size_t lookahead,
                           std::uint64_t block_bytes, CacheSettings cache, RemoteSettings remote,
                           std::uint64_t reserved)
    : objects_(std::move(objects)),
      block_(std::max(block_bytes, kMinBlockBytes)),
      lookahead_(std::max<std::size_t>(1, lookahead)),
      remote_(std::move(remote)),
      cache_(std::move(cache)),
      id_(g_reader_ids.fetch_add(1)) {
  std::vector<std::uint64_t> sizes;
  first_.push_back(0);
  for (const auto& o : objects_) {
    sizes.push_back(o.size);
    first_.push_back(first_.back() + block_count(o.size, block_));
  }
  const std::uint64_t limit = cache_.settings().limit;
  budget_ = limit > reserved ? limit - reserved : 0;
  const std::uint64_t need = blocks_needed(sizes, block_, lookahead_);
  std::uint64_t total = 0;
  for (const std::uint64_t size : sizes) total += size;
  // Beside what the other processes sharing the directory reserve (cache_reservations.h):
  // every block is held when they all fit there, and the look-ahead must.
  // Other processes holding every block of the same objects hold the same copies (a share).
  share_ = objects_share(objects_, block_);
  std::uint64_t room = budget_;
  const auto check = [&](const std::vector<ProcessReservation>& processes) {
    const std::uint64_t elsewhere = reserved_bytes(processes, share_);
    room = budget_ > elsewhere ? budget_ - elsewhere : 0;
    if (need > room) {
      const std::string& key = cache_.settings().limit_key;
      throw ConfigError(
          key,
          "the cache limit " + bytes_text(limit) +
              (reserved > 0 ? " (less the " + bytes_text(reserved) + " of the source's index files)"
                            : std::string()) +
              (processes.empty() ? std::string()
                                 : " of '" + cache_.settings().dir.string() + "' (less " +
                                       reserved_by_others(processes, share_) + ")") +
              " is smaller than the " + bytes_text(need) +
              " of the blocks the look-ahead holds together (lookahead: " +
              std::to_string(lookahead_) + " blocks of up to " + bytes_text(block_) +
              " ahead of the one read); raise " + key +
              " or lower the source's lookahead or FLOWSTATE_REMOTE_BLOCK" +
              (processes.empty() ? std::string() : std::string(", or ") + kOwnCacheDirectory));
    }
    hold_all_ = total <= room;
    if (hold_all_) return std::vector<CacheClaim>{{.bytes = total + reserved, .share = share_}};
    return std::vector<CacheClaim>{{.bytes = need + reserved}};
  };
  shared_ = std::make_unique<CacheReservation>(cache_.settings(), check);
  plan_on_ = remote_plan_from_environment();
  // The plan's pins: the limit less the look-ahead's least (lookahead + 1 of the largest blocks),
  // left to the blocks just read — a record is read again right after (the assembler's gather
  // asks for a record a few ahead, then copies it) — and to the block a read downloads itself;
  // but at least `lookahead` of the largest blocks, which the check above leaves room for.
  plan_budget_ = std::max(lookahead_ > 1 ? blocks_needed(sizes, block_, lookahead_ - 1)
                                         : blocks_needed(sizes, block_, 0),
                          room > need ? room - need : 0);
  populate_ = hold_all_ && fits_a_quarter_of_memory(total);
  if (hold_all_) {
    published_ = std::make_unique<std::atomic<const MappedFile*>[]>(first_.back());
    for (std::uint64_t g = 0; g < first_.back(); ++g) published_[g].store(nullptr);
  }
  // `connections` downloaders, fewer than the look-ahead's blocks when not all are held.
  const auto connections = static_cast<std::uint64_t>(std::max(1, remote_.connections));
  const std::size_t downloaders = static_cast<std::size_t>(
      hold_all_ ? std::min<std::uint64_t>(connections, std::max<std::uint64_t>(1, first_.back()))
                : std::min<std::uint64_t>(lookahead_, connections));
  for (std::size_t i = 0; i < downloaders; ++i)
    downloaders_.emplace_back([this] { download_ahead(); });
}

RemoteBlocks::~RemoteBlocks() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (auto& t : downloaders_) t.join();
  write_stats();
}

void RemoteBlocks::write_stats() const {
  const char* path = std::getenv("FLOWSTATE_REMOTE_STATS");
  if (path == nullptr || *path == '\0') return;
  const BlockReadStats s = stats();
  // One line per reader, appended whole (O_APPEND): a debug stat the tests and benchmarks read.
  const std::string line = "{\"blocks\": " + std::to_string(first_.back()) +
                           ", \"held\": " + std::to_string(s.held) +
                           ", \"in_flight\": " + std::to_string(s.in_flight) +
                           ", \"on_demand\": " + std::to_string(s.on_demand) +
                           ", \"fetches\": " + std::to_string(s.fetches) +
                           ", \"planned_fetches\": " + std::to_string(s.planned_fetches) +
                           ", \"planned_reads\": " + std::to_string(s.planned_reads) + "}\n";
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fwrite(line.data(), 1, line.size(), f);
    std::fclose(f);
  }
}

BlockReadStats RemoteBlocks::stats() const {
  std::lock_guard lock(mu_);
  BlockReadStats s = stats_;
  s.fetches = fetches_;
  return s;
}

void RemoteBlocks::plan(std::span<const PlannedRead> reads) const {
  if (!plans() || reads.empty()) return;
  // Planned reads not read yet, at most: past it (reads that never came) the plan starts over.
  constexpr std::size_t kMaxPlanned = std::size_t{1} << 16;
  {
    std::lock_guard lock(mu_);
    if (plan_.size() + reads.size() > kMaxPlanned) {
      for (auto& [g, s] : slots_) {
        if (s.plan_pin) drop_plan_pin(g, s);
        s.planned = 0;
      }
      plan_.clear();
    }
    for (const PlannedRead& r : reads) {
      if (r.length == 0 || r.object >= objects_.size()) continue;
      const RemoteObject& o = objects_[r.object];
      if (r.offset > o.size || r.length > o.size - r.offset) continue;  // the read will say
      const BlockSpan span = blocks_spanned(r.offset, r.length, block_);
      for (std::uint64_t k = span.first; k <= span.last; ++k) {
        const std::uint64_t g = first_[r.object] + k;
        ++slots_[g].planned;
        if (plan_.empty() || plan_.back() != g) plan_.push_back(g);
      }
      ++stats_.planned_reads;
    }
    planning_.store(true, std::memory_order_relaxed);
    sequential_ = false;  // the plan replaces the read-following look-ahead
  }
  work_.notify_all();
}

void RemoteBlocks::drop_plan_pin(std::uint64_t g, Slot& s) const {
  s.plan_pin = false;
  plan_bytes_ -= range_of(g).length;
}

void RemoteBlocks::consume_planned(std::uint64_t g) const {
  const auto it = slots_.find(g);
  if (it == slots_.end() || it->second.planned == 0) return;
  Slot& s = it->second;
  if (--s.planned > 0) return;
  if (s.plan_pin) {
    drop_plan_pin(g, s);
    work_.notify_all();  // the plan's bytes have room for its next block
  }
  // A slot kept only for its planned reads (its block unpinned meanwhile) goes.
  if (!s.pin && !s.fetching && !s.error) slots_.erase(it);
}

std::uint64_t RemoteBlocks::claim_planned() const {
  // The blocks read (planned reads left: none) leave the plan's front.
  while (!plan_.empty()) {
    const auto it = slots_.find(plan_.front());
    if (it != slots_.end() && it->second.planned > 0) break;
    plan_.pop_front();
  }
  for (const std::uint64_t g : plan_) {
    Slot& s = slots_[g];
    if (s.planned == 0 || s.plan_pin || s.error) continue;
    const std::uint64_t length = range_of(g).length;
    if (plan_bytes_ + length > plan_budget_) return kNone;  // the plan's bytes are spent
    if (s.map || s.fetching) {
      // Held already (or downloading for a read): kept for the plan from here on.
      s.plan_pin = true;
      plan_bytes_ += length;
      continue;
    }
    if (!make_room(length)) return kNone;
    Slot& claimed = slots_[g];  // (make_room unpinned only blocks held, not this one)
    claimed.plan_pin = true;
    plan_bytes_ += length;
    claimed.fetching = true;
    held_bytes_ += length;
    ++stats_.planned_fetches;
    return g;
  }
  return kNone;
}

void RemoteBlocks::new_pass() {
  std::lock_guard lock(mu_);
  new_pass_ = true;
}

std::uint64_t RemoteBlocks::fetches() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

std::size_t RemoteBlocks::object_of(std::uint64_t g) const {
  return static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), g) -
                                  first_.begin() - 1);
}

ByteRange RemoteBlocks::range_of(std::uint64_t g) const {
  const std::size_t k = object_of(g);
  return block_range(objects_[k].size, block_, g - first_[k]);
}

BlockSpan RemoteBlocks::span_of(std::size_t object, std::uint64_t offset,
                                std::size_t length) const {
  const RemoteObject& o = objects_.at(object);
  if (offset > o.size || length > o.size - offset) [[unlikely]]
    throw DataError(o.url, offset,
                    "bytes " + std::to_string(offset) + "+" + std::to_string(length) + " of '" +
                        o.url + "' lie past its " + std::to_string(o.size) + " bytes");
  return blocks_spanned(offset, length, block_);
}

const MappedFile& RemoteBlocks::held(std::uint64_t g) const {
  if (const MappedFile* m = published_[g].load(std::memory_order_acquire)) [[likely]]
    return *m;
  open(g);  // publishes it
  return *published_[g].load(std::memory_order_acquire);
}

std::span<const std::byte> RemoteBlocks::view(std::size_t object, std::uint64_t offset,
                                              std::size_t length) const {
  if (length == 0) return {};
  const BlockSpan span = span_of(object, offset, length);
  if (span.first == span.last)
    return {held(first_[object] + span.first).data() + (offset - span.first * block_), length};
  {
    std::lock_guard lock(kept_mu_);
    const auto it = kept_[object].find(offset);
    if (it != kept_[object].end() && it->second.size() == length) return it->second;
  }
  std::vector<std::byte> copy(length);
  std::size_t done = 0;
  for (std::uint64_t k = span.first; k <= span.last; ++k) {
    const ByteRange r = block_range(objects_[object].size, block_, k);
    const MappedFile& m = held(first_[object] + k);
    const std::uint64_t from = std::max(offset, r.offset);
    const std::uint64_t to = std::min(offset + length, r.offset + r.length);
    std::memcpy(copy.data() + done, m.data() + (from - r.offset),
                static_cast<std::size_t>(to - from));
    done += static_cast<std::size_t>(to - from);
  }
  std::lock_guard lock(kept_mu_);
  // A copy another thread kept meanwhile holds the same bytes: the first one stays.
  return kept_[object].try_emplace(offset, std::move(copy)).first->second;
}

std::span<const std::byte> RemoteBlocks::read(std::size_t object, std::uint64_t offset,
                                              std::size_t length) const {
  if (length == 0) return {};
  if (hold_all_) return view(object, offset, length);
  const RemoteObject& o = objects_[object];
  const BlockSpan span = span_of(object, offset, length);
  HeldBlock& t = t_held;
  // Makes block g the one this thread holds.
  const auto hold = [&](std::uint64_t g) {
    if (t.reader != id_ || t.g != g) {
      // Hold nothing while this read waits: the block the thread read last is not kept for it.
      t.map.reset();
      t.reader = 0;
      t.map = open(g);
      t.reader = id_;
      t.g = g;
    } else if (planning_.load(std::memory_order_relaxed)) {
      std::lock_guard lock(mu_);
      consume_planned(g);
    }
  };
  if (span.first == span.last) {
    hold(first_[object] + span.first);
    return {t.map->data() + (offset - span.first * block_), length};
  }
  // Across blocks: copied block after block, one pinned at a time.
  t.buffer.resize(length);
  std::size_t done = 0;
  for (std::uint64_t k = span.first; k <= span.last; ++k) {
    const ByteRange r = block_range(o.size, block_, k);
    hold(first_[object] + k);
    const std::uint64_t from = std::max(offset, r.offset);
    const std::uint64_t to = std::min(offset + length, r.offset + r.length);
    std::memcpy(t.buffer.data() + done, t.map->data() + (from - r.offset),
                static_cast<std::size_t>(to - from));
    done += static_cast<std::size_t>(to - from);
  }
  return {t.buffer.data(), length};
}

std::shared_ptr<const MappedFile> RemoteBlocks::open(std::uint64_t g) const {
  std::unique_lock lock(mu_);
  if (hold_all_ && !adopted_) adopt_cached(lock);
  const auto held = [&](std::uint64_t j) {
    const auto it = slots_.find(j);
    return it != slots_.end() && (it->second.map || it->second.fetching);
  };
  if (!started_ || (new_pass_ && g < front_ && !held(g))) {
    // The first read, or the first read of the next pass behind the front.
    started_ = true;
    sequential_ = true;
    new_pass_ = false;
    front_ = g;
    work_.notify_all();
  } else if (g >= front_) {
    // Progress within the look-ahead keeps it; a jump (a random read far ahead) does not.
    sequential_ = g <= front_ + lookahead_;
    front_ = g;
    work_.notify_all();
  }
  if (planning_.load(std::memory_order_relaxed)) sequential_ = false;  // the plan looks ahead
  // How this read found its block: counted once, at its first look.
  enum class Found { kNotYet, kHeld, kInFlight, kOnDemand } found = Found::kNotYet;
  for (;;) {
    Slot& s = slots_[g];
    s.last_read = ++clock_;
    if (s.map) {
      if (found == Found::kNotYet) ++stats_.held;
      consume_planned(g);
      return s.map;
    }
    if (s.error) std::rethrow_exception(s.error);
    if (s.fetching) {
      if (found == Found::kNotYet) {
        found = Found::kInFlight;
        ++stats_.in_flight;
      }
      changed_.wait(lock);
      continue;
    }
    // Not held and no one downloads it: this read fetches it, once there is room.
    if (found == Found::kNotYet) {
      found = Found::kOnDemand;
      ++stats_.on_demand;
    }
    const std::uint64_t length = range_of(g).length;
    if (!make_room(length, /*for_read=*/true)) {
      changed_.wait(lock);
      continue;
    }
    Slot& claimed = slots_[g];  // (make_room erased only pinned slots; this one has no pin)
    claimed.fetching = true;
    held_bytes_ += length;
    fetch(g, lock);
  }
}

bool RemoteBlocks::make_room(std::uint64_t bytes, bool for_read) const {
  // The limit less what other processes reserve of the directory now: room borrowed while
  // they were not there is given back here.
  const std::uint64_t elsewhere =
      reserved_bytes(other_reservations(cache_.settings().dir), hold_all_ ? share_ : "");
  const std::uint64_t room = budget_ > elsewhere ? budget_ - elsewhere : 0;
  while (held_bytes_ + bytes > room) {
    auto victim = slots_.end();
    auto planned_victim = slots_.end();  // a block pinned for the plan, read the latest
    bool in_flight = false;
    for (auto it = slots_.begin(); it != slots_.end(); ++it) {
      in_flight = in_flight || it->second.fetching;
      if (!it->second.pin || needed(it->first)) continue;
      if (it->second.plan_pin) {
        if (planned_victim == slots_.end() ||
            it->second.last_read > planned_victim->second.last_read)
          planned_victim = it;
        continue;
      }
      if (victim == slots_.end() || it->second.last_read < victim->second.last_read) victim = it;
    }
    if (victim == slots_.end() && for_read && planned_victim != slots_.end()) {
      // A read goes first: the plan's pin gives way (the plan pins the block again later).
      victim = planned_victim;
      drop_plan_pin(victim->first, victim->second);
    }
    if (victim == slots_.end()) {
      // Only the look-ahead, the plan's blocks and downloads in flight are held. When nothing is
      // in flight the build-time check says the bytes fit; the cache decides (other processes
      // share it).
      return !in_flight;
    }
    // Unpinned: the cache may evict it. A thread still reading it holds the mapping. A block
    // the plan still names keeps its slot (its count of planned reads).
    held_bytes_ -= range_of(victim->first).length;
    if (victim->second.planned > 0) {
      victim->second.pin.reset();
      victim->second.map.reset();
    } else {
      slots_.erase(victim);
    }
  }
  return true;
}

void RemoteBlocks::fetch(std::uint64_t g, std::unique_lock<std::mutex>& lock) const {
  ++fetches_;
  const ByteRange r = range_of(g);
  const RemoteObject& o = objects_[object_of(g)];
  lock.unlock();
  std::shared_ptr<const CachePin> pin;
  std::shared_ptr<const MappedFile> map;
  std::exception_ptr error;
  try {
    pin = cache_.fetch_range(o, r.offset, r.length, remote_);
    map = std::make_shared<const MappedFile>(pin->path());
    if (map->size() != r.length)
      throw DataError(o.url, r.offset,
                      "the cached block of '" + o.url + "' at byte " + std::to_string(r.offset) +
                          " is not " + bytes_text(r.length));
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  Slot& s = slots_[g];
  s.fetching = false;
  if (error) {
    held_bytes_ -= r.length;
    s.error = error;
    if (s.plan_pin) drop_plan_pin(g, s);
  } else {
    s.pin = std::move(pin);
    s.map = std::move(map);
    if (hold_all_) published_[g].store(s.map.get(), std::memory_order_release);
    if (populate_) unpopulated_.push_back(g);
  }
  changed_.notify_all();
  work_.notify_all();
  if (error) std::rethrow_exception(error);
}

void RemoteBlocks::adopt_cached(std::unique_lock<std::mutex>& lock) const {
  if (adopting_) {
    changed_.wait(lock, [&] { return adopted_; });
    return;
  }
  adopting_ = true;
  const std::uint64_t total = first_.back();
  lock.unlock();
  std::vector<std::shared_ptr<const CachePin>> pins;
  std::vector<std::shared_ptr<const MappedFile>> maps(total);
  try {
    std::vector<ObjectCache::Range> ranges;
    ranges.reserve(total);
    for (std::uint64_t g = 0; g < total; ++g) {
      const ByteRange r = range_of(g);
      ranges.push_back({&objects_[object_of(g)], r.offset, r.length});
    }
    pins = cache_.pin_cached(ranges);
    for (std::uint64_t g = 0; g < total; ++g) {
      if (!pins[g]) continue;
      auto map = std::make_shared<const MappedFile>(pins[g]->path());
      if (map->size() == ranges[g].length) maps[g] = std::move(map);
    }
  } catch (...) {
    // The blocks are fetched one by one instead, as when none is cached: a failure there is
    // raised to the read that needs the block.
    pins.assign(total, nullptr);
    maps.assign(total, nullptr);
  }
  lock.lock();
  for (std::uint64_t g = 0; g < total; ++g) {
    if (!maps[g]) continue;
    Slot& s = slots_[g];
    if (s.map || s.fetching) continue;  // (no read or downloader claims a block before this)
    held_bytes_ += range_of(g).length;
    ++fetches_;  // asked for, and found cached
    s.pin = std::move(pins[g]);
    s.map = std::move(maps[g]);
    published_[g].store(s.map.get(), std::memory_order_release);
    if (populate_) unpopulated_.push_back(g);
  }
  // The downloaders populate from the back: the first blocks first.
  std::reverse(unpopulated_.begin(), unpopulated_.end());
  adopting_ = false;
  adopted_ = true;
  changed_.notify_all();
  work_.notify_all();
}

void RemoteBlocks::download_ahead() {
  // One of `connections` downloaders: each takes the look-ahead's first block not held (if it
  // fits), downloads it, and takes the next.
  std::unique_lock lock(mu_);
  const std::uint64_t total = first_.back();
  for (;;) {
    if (stop_) return;
    std::uint64_t claimed = kNone;
    if (planning_.load(std::memory_order_relaxed) && !hold_all_) {
      // The plan's next block (the reads' order, given by the spine).
      claimed = claim_planned();
    } else if (started_ && hold_all_) {
      // Every block, the front's first: from the front to the end, then from the start.
      for (std::uint64_t i = 0; i < total && claimed == kNone; ++i) {
        const std::uint64_t j = (front_ + i) % total;
        const auto it = slots_.find(j);
        if (it != slots_.end() && (it->second.map || it->second.fetching || it->second.error))
          continue;
        const std::uint64_t length = range_of(j).length;
        held_bytes_ += length;  // (the limit holds every block: no room to make)
        slots_[j].fetching = true;
        claimed = j;
      }
    } else if (started_ && sequential_) {
      const std::uint64_t end = std::min(total, front_ + lookahead_);
      for (std::uint64_t j = front_ + 1; j < end; ++j) {
        const auto it = slots_.find(j);
        if (it != slots_.end() && (it->second.map || it->second.fetching || it->second.error))
          continue;
        const std::uint64_t length = range_of(j).length;
        if (make_room(length)) {
          slots_[j].fetching = true;
          held_bytes_ += length;
          claimed = j;
        }
        break;
      }
    }
    if (claimed == kNone && !unpopulated_.empty()) {
      // Nothing to download: a published block's pages mapped in here, on the downloader, as
      // an indexed source's local .bin is populated — not faulted in by the workers' first
      // reads, a few pages at a time. Published first, so no read waits for it. EINVAL (a
      // kernel before 5.14) leaves them to the faults. (Slots of a reader that holds every
      // block are never erased: the mapping outlives the call.)
      const std::uint64_t g = unpopulated_.back();
      unpopulated_.pop_back();
      const std::shared_ptr<const MappedFile> map = slots_[g].map;
      lock.unlock();
      if (map && !map->in_memory() && map->size() > 0)
        ::madvise(const_cast<std::byte*>(map->data()), map->size(), MADV_POPULATE_READ);
      lock.lock();
      continue;
    }
    if (claimed == kNone) {
      work_.wait(lock);
      continue;
    }
    try {
      fetch(claimed, lock);
    } catch (...) {
      // Stored in the slot: the read that needs the block raises it.
    }
  }
}

}  // namespace flowstate
